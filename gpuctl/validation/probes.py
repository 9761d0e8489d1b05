"""What `gpuctl validate` runs on each node, per level: the real commands, as data.

Every probe is a command line that an operator could type on the node (the same on a real
cluster and in the lab), the kind its output is parsed as (the bundle file ``<kind>.txt``, see
:mod:`gpuctl.validation.bundle`), a timeout, the levels it belongs to and the hardware it needs
(``needs``, declared with the probe). This table is the only place a command is declared
(`gpuctl parse list` shows these). A judge in :mod:`gpuctl.validation.judges` applies to a node
exactly where a probe of a kind it reads runs (:func:`collects`), so a node is never asked for
output no judge reads, and no judge waits for output that was never collected.

Levels and their budgets. A budget bounds one node's own probes in the worst case (every
probe running into its timeout, one after the other); nodes run in parallel. Typical times on
an 8-GPU node are far lower.

- ``quick`` (typically seconds; budget 4 min): GPU inventory and health (``nvidia-smi -q -x``),
  the topology matrix, NVLink states, the kernel log (Xid), Fabric Manager, InfiniBand ports,
  the required mounts (``df``).
- ``standard`` (typically a few minutes; budget 55 min): quick, plus ``slurmd -C``, the PCIe
  bridges and adapters (``lspci -vvv``), the error counters' first reads, single-node
  nccl-tests over every GPU (all_reduce_perf, then
  all_gather_perf, reduce_scatter_perf, alltoall_perf and sendrecv_perf), nvbandwidth's
  host-to-device and device-to-host copies (the one DCGM 4 ships), ``dcgmi diag -r 2`` and,
  where ``software.perftest`` builds perftest with CUDA, GPUDirect RDMA per GPU (30 s each,
  :mod:`gpuctl.validation.gpudirect`); then ib_write_bw between pairs of
  nodes, every HCA one after the other (``IB_WRITE_BW_TIMEOUT_S``: 60 s per HCA on the node,
  killed 10 s later, the channel given up 25 s after that; the server gets 15 s to start;
  typically 2-3 s), in one round for an even count of nodes and two for an odd one, plus retest
  rounds for failed pairs (a node alone in the run: with a partner outside --limit, else a
  loopback between its own HCAs, :mod:`gpuctl.validation.pairs`).
- ``long`` (typically 30-60 min; budget 108 min): standard with ``dcgmi diag -r 3`` instead of
  ``-r 2``; then, once per node group, multi-node nccl-tests all_reduce_perf through Slurm
  (``srun`` on the controller, one rank per GPU) and, when that run is below its threshold,
  the locator's runs on subsets of the nodes (:mod:`gpuctl.validation.multinode`). Those are
  not per-node probes and not in this table: they run after every node's own probes, at most
  ``validation.multinode.max_runs`` runs of at most 11 min each per group (typically one run
  of a few minutes).
- ``burn`` (asked for with ``--duration``; budget 228 min plus the duration): long with
  ``dcgmi diag -r 4`` instead of ``-r 3``, then the burn loop for the duration
  (:mod:`gpuctl.validation.burn`: DCGM stress runs and all_reduce_perf sampled by
  ``nvidia-smi dmon``), before the multi-node phase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TypeVar

from gpuctl.config.model import LEVELS, Level
from gpuctl.validation import gpudirect
from gpuctl.validation.expect import ExpectedNic, NodeExpectation, split_port

T = TypeVar("T")
QUICK, STANDARD, LONG = Level.QUICK.value, Level.STANDARD.value, Level.LONG.value
BURN = Level.BURN.value

# Each level's worst-case time for one node's own probes (seconds): the sum of their timeouts
# stays below it (a unit test checks every example cluster).
# burn: long's, with dcgmi diag -r 4 in place of -r 3, and the burn loop's --duration on top
LEVEL_BUDGET_S: Mapping[str, int] = {QUICK: 240, STANDARD: 3300, LONG: 6480, BURN: 13680}


@dataclass(frozen=True, slots=True)
class Probe:
    """One command run on a node; its output is stored as ``<kind>.txt`` and parsed as ``kind``."""

    kind: str
    # may hold {gpus} (the node's GPU count), {cuda} (the CUDA major of its DCGM package)
    argv: tuple[str, ...]
    timeout_s: int
    levels: frozenset[str]
    needs: Callable[[NodeExpectation], bool]  # which nodes run it
    exclusive: bool = False  # loads the GPUs: runs alone on its node, after the light probes
    description: str = ""
    # a second read of counters (``<kind>.end``; its first read ``<kind>.start`` runs with the
    # light probes), so that growth under load is judged: AFTER_GPU_TESTS runs after the node's
    # exclusive probes, AFTER_PAIRS after ib_write_bw between nodes (node-check: both last)
    after: str = ""
    # one probe per InfiniBand adapter port of the node: ``{hca}`` (device) and ``{port}`` in
    # argv, kind ``<kind>.<name>`` (ExpectedNic.name)
    per_hca: bool = False
    # with per_hca: the kinds of adapter it runs for (RoCE ports too, where the tool reads them)
    nic_kinds: tuple[str, ...] = ("infiniband",)
    # with per_hca: also on the ports of a device with several (ConnectX-3 class, nics[].ports)
    multiport: bool = True
    # one GPUDirect RDMA run per GPU (:mod:`gpuctl.validation.gpudirect`): kind ``<kind><gpu>``;
    # ``{hca}`` (the adapter nearest the GPU) is known only once topo -m has been read, so the
    # collector fills it in and runs the loopback's server and client
    per_gpu: bool = False
    # the burn loop (gpuctl/validation/burn_collect.py builds and runs its commands)
    burn: bool = False

    def command(self, exp: NodeExpectation) -> tuple[str, ...]:
        """The argv for ``exp``'s node: ``{gpus}`` its GPU count; the word ``{mounts}`` its
        required mount points, one word each (each word is quoted on the way to the node)."""
        if self.per_gpu or self.burn:
            return self.argv  # made per GPU (:func:`_per_gpu`); {hca}: the collector fills it
        words: list[str] = []
        for a in self.argv:
            if a == "{mounts}":
                words += [m.path for m in exp.mounts]
            else:
                words.append(a.format(gpus=exp.gpu_count, cuda=exp.nvbandwidth_cuda or ""))
        return tuple(words)

    @property
    def parser(self) -> str:
        """The parser of its output: the kind up to the first dot (``nvlink-errors.start``)."""
        return parser_of(self.kind)


AFTER_GPU_TESTS, AFTER_PAIRS = "gpu-tests", "pairs"
# dcgmi diag -r 4 (memtest, pulse_test on top of -r 3's): DCGM documents it as hours long
BURN_DCGM_TIMEOUT_S = 10800


def parser_of(kind: str) -> str:
    """The parser kind of an output kind: ``nvlink-errors.end`` -> ``nvlink-errors``."""
    return kind.split(".", 1)[0]


def phases(plan: Sequence[T]) -> tuple[list[T], list[T], list[T], list[T]]:
    """A node's plan (probes, or (probe, argv) pairs) in the order every runner keeps: the
    light probes (run at once), the exclusive ones (one by one), the second reads after them,
    the second reads after ib_write_bw between nodes."""
    light: list[T] = []
    heavy: list[T] = []
    after_gpu: list[T] = []
    after_pairs: list[T] = []
    for item in plan:
        probe = item if isinstance(item, Probe) else item[0]  # type: ignore[index]
        if probe.after == AFTER_PAIRS:
            after_pairs.append(item)
        elif probe.after:
            after_gpu.append(item)
        else:
            (heavy if probe.exclusive else light).append(item)
    return light, heavy, after_gpu, after_pairs


@dataclass(frozen=True, slots=True)
class Collective:
    """One nccl-tests collective gpuctl runs on a node: its binary, the kind of its output, the
    prefix of its checks (``<check>.busbw``, ``.wrong``, ``.errors``, ``.ranks``) and the
    threshold key of its busbw floor."""

    name: str
    binary: str
    kind: str
    check: str
    threshold: str


def _collective(name: str) -> Collective:
    return Collective(
        name, f"{name}_perf", f"nccl.{name}", f"nccl.{name}", f"nccl_{name}_busbw_gbs"
    )


# all_reduce keeps the names it had before the others were added (kind and checks "nccl")
NCCL_COLLECTIVES: tuple[Collective, ...] = (
    Collective("all_reduce", "all_reduce_perf", "nccl", "nccl", "nccl_all_reduce_busbw_gbs"),
    *(_collective(n) for n in ("all_gather", "reduce_scatter", "alltoall", "sendrecv")),
)
# a run of 8 B to 8 GiB takes well under a minute on an 8-GPU node (NCCL's set-up included)
NCCL_COLLECTIVE_TIMEOUT_S = 180


def collective(kind: str) -> Collective:
    """The collective whose output is ``kind``."""
    return next(c for c in NCCL_COLLECTIVES if c.kind == kind)


def _levels(*names: str) -> frozenset[str]:
    """The levels named; burn runs everything long runs (a probe that long alone runs says
    ``frozenset({LONG})``)."""
    return frozenset(names) | ({BURN} if LONG in names else set())


# Which nodes need a probe (a probe's ``needs``). The judges follow: each applies where a probe
# of a kind it reads runs (:func:`collects`), so these are the only copy of the conditions.


def any_gpu(e: NodeExpectation) -> bool:
    return e.gpu_count > 0


def gpus_or_nics(e: NodeExpectation) -> bool:
    """Two or more GPUs (a matrix between them), or any high-speed NIC (GPU-NIC affinity)."""
    return e.gpu_count >= 2 or bool(e.nics)


def multi_gpu(e: NodeExpectation) -> bool:
    return e.gpu_count >= 2


def nvlinked(e: NodeExpectation) -> bool:
    """GPUs joined by NVLink (bridge or NVSwitch)."""
    return e.interconnect in ("nvswitch", "nvlink", "nvlink-bridge")


def nvswitch(e: NodeExpectation) -> bool:
    """NVSwitch systems, which run Fabric Manager."""
    return e.fabric_manager


def any_nic(e: NodeExpectation) -> bool:
    """InfiniBand / RoCE adapters."""
    return bool(e.nics)


def mft_nics(e: NodeExpectation) -> bool:
    """Adapters on a node where cluster.yml installs MFT (mlxlink is part of it)."""
    return e.mft and bool(e.nics)


def slurm_compute(e: NodeExpectation) -> bool:
    """Nodes gpuctl wrote a NodeName line for with CPUs or RealMemory (slurmd runs there)."""
    return e.slurm_cpu is not None or e.slurm_memory_mb is not None


def required_mounts(e: NodeExpectation) -> bool:
    """Nodes cluster.yml names file systems for (``validation.mounts``)."""
    return bool(e.mounts)


def nvbandwidth(e: NodeExpectation) -> bool:
    """GPU nodes whose DCGM package ships nvbandwidth (DCGM 4)."""
    return e.gpu_count > 0 and e.nvbandwidth_cuda is not None


# DCGM 4 ships NVIDIA's nvbandwidth in its CUDA package (datacenter-gpu-manager-4-cuda<major>,
# what the dcgm role installs) for its own nvbandwidth plugin: NVIDIA/DCGM
# nvvs/plugin_src/nvbandwidth/Cuda12/CMakeLists.txt installs bin/<arch>/nvbandwidth into
# ${DCGM_NVVS_PLUGINS_INSTALL_DIR}/cuda12 (${CMAKE_INSTALL_LIBEXECDIR}/datacenter-gpu-manager-4/
# plugins, CMakeLists.txt); scripts/verify_package_contents/datacenter-gpu-manager-cuda12_
# amd64.deb.txt lists ./usr/libexec/datacenter-gpu-manager-<MAJORVERSION>/plugins/cuda12/
# nvbandwidth (the .rpm the same /usr/libexec path). DCGM 3 has no nvbandwidth.
NVBANDWIDTH = "/usr/libexec/datacenter-gpu-manager-4/plugins/cuda{cuda}/nvbandwidth"
# its testcases gpuctl runs: the copy engines between the host and each GPU, what
# Azure/azurehpc-health-checks' azure_gpu_bandwidth.nhc runs (and the floors it judges them by)
NVBANDWIDTH_H2D = "host_to_device_memcpy_ce"
NVBANDWIDTH_D2H = "device_to_host_memcpy_ce"
# copies between every GPU pair by the copy engines, each GPU reading from and writing to each
# peer: over NVSwitch every pair has the same NVLink bandwidth, so one slow pair is a fault
NVBANDWIDTH_D2D_READ = "device_to_device_memcpy_read_ce"
NVBANDWIDTH_D2D_WRITE = "device_to_device_memcpy_write_ce"


def nvswitch_peers(e: NodeExpectation) -> bool:
    """GPUs on an NVSwitch (every pair the same NVLink bandwidth) whose DCGM ships nvbandwidth."""
    return nvbandwidth(e) and e.gpu_count >= 2 and e.interconnect == "nvswitch"


def ib_nics(e: NodeExpectation) -> bool:
    """InfiniBand adapters (perfquery reads their port counters; RoCE ports have none)."""
    return any(n.kind == "infiniband" for n in e.nics)


def _read_twice(
    kind: str,
    argv: tuple[str, ...],
    needs: Callable[[NodeExpectation], bool],
    what: str,
    nic_kinds: tuple[str, ...],
) -> tuple[Probe, Probe]:
    """An adapter's port counters read per adapter with the light probes (``<kind>.start``)
    and again after ib_write_bw between nodes (``<kind>.end``): growth under load is judged."""
    return (
        Probe(
            f"{kind}.start",
            argv,
            10,
            _levels(STANDARD, LONG),
            needs,
            per_hca=True,
            nic_kinds=nic_kinds,
            description=f"{what}, before the tests",
        ),
        Probe(
            f"{kind}.end",
            argv,
            10,
            _levels(STANDARD, LONG),
            needs,
            per_hca=True,
            nic_kinds=nic_kinds,
            after=AFTER_PAIRS,
            description=f"{what} again, after ib_write_bw between nodes",
        ),
    )


def roce_nics(e: NodeExpectation) -> bool:
    """RoCE adapters (``rdma statistic`` reads their ports' hw counters)."""
    return any(n.kind == "roce" for n in e.nics)


PROBES: tuple[Probe, ...] = (
    Probe(
        "smi-xml",
        ("nvidia-smi", "-q", "-x"),
        60,
        _levels(QUICK, STANDARD, LONG),
        any_gpu,
        description=(
            "GPU inventory, driver, ECC and row remapping, PCIe link, clocks, fabric, "
            "persistence mode"
        ),
    ),
    Probe(
        "topo",
        ("nvidia-smi", "topo", "-m"),
        30,
        _levels(QUICK, STANDARD, LONG),
        gpus_or_nics,
        description="GPU/NIC link matrix (NVLink count per pair, GPU-NIC PCIe affinity)",
    ),
    Probe(
        "nvlink",
        ("nvidia-smi", "nvlink", "-s"),
        30,
        _levels(QUICK, STANDARD, LONG),
        nvlinked,
        description="every NVLink's speed, or <inactive>",
    ),
    Probe(
        "xid",
        # The kernel log of the current boot (kernel messages carry SYSLOG_IDENTIFIER=kernel).
        # Not bounded with --since: a quiet node has no kernel line in the last hours, and an
        # empty journal cannot be told apart from one that does not see the kernel; the
        # boot's own lines prove it does. The Xid window (data/xid.yml) is applied when
        # judging, to the ISO timestamps; an Xid from before the last reboot does not count.
        ("journalctl", "-t", "kernel", "-b", "--no-pager", "-o", "short-iso"),
        30,
        _levels(QUICK, STANDARD, LONG),
        any_gpu,
        description="NVRM Xid events, GPUs fallen off the bus, NVSwitch SXid events",
    ),
    Probe(
        "fabricmanager",
        ("systemctl", "status", "nvidia-fabricmanager", "--no-pager", "-l"),
        30,
        _levels(QUICK, STANDARD, LONG),
        nvswitch,
        description="Fabric Manager unit state, version, errors",
    ),
    Probe(
        "ibstat",
        ("ibstat",),
        30,
        _levels(QUICK, STANDARD, LONG),
        any_nic,
        description="HCA ports: state, physical state, rate, link layer",
    ),
    Probe(
        "uname",
        ("uname", "-r"),
        10,
        _levels(QUICK, STANDARD, LONG),
        lambda e: any_gpu(e) or any_nic(e),  # every node a GPU or NIC judge looks at
        description="the running kernel's release (compared across the node group)",
    ),
    Probe(
        "ofed-info",
        ("ofed_info", "-s"),
        10,
        _levels(QUICK, STANDARD, LONG),
        lambda e: e.doca_version is not None,  # where cluster.yml installs DOCA-OFED
        description="the DOCA-OFED / MLNX_OFED version (compared across the node group)",
    ),
    Probe(
        "df",
        # the required mount points only: a df of every mount would wait on each network file
        # system (and trigger every automount); "file" names the path asked for in each row
        ("df", "-B1", "--output=file,target,fstype,size,avail", "--", "{mounts}"),
        10,
        _levels(QUICK, STANDARD, LONG),
        required_mounts,
        description="the file systems cluster.yml requires: mount point, type, free space",
    ),
    Probe(
        "clock",
        # the node's clock against gpuctl's: the collector records when it sent the command and
        # when the answer came back (meta.json sent_at, received_at)
        ("date", "-u", "+%s.%N"),
        10,
        _levels(STANDARD, LONG),
        lambda e: any_gpu(e) or any_nic(e) or bool(e.mounts),
        description="the node's clock (compared with gpuctl's when the command ran)",
    ),
    Probe(
        "meminfo",
        ("cat", "/proc/meminfo"),
        10,
        _levels(STANDARD, LONG),
        lambda e: e.hugepages is not None,  # where cluster.yml asks for a hugepage pool
        description="the node's hugepage pool (HugePages_Total, Hugepagesize)",
    ),
    # which GPU pairs the driver lets read each other's memory (peer access); the matrix of
    # `topo -m` says how they are joined, this one whether CUDA may use it
    Probe(
        "topo-p2p",
        ("nvidia-smi", "topo", "-p2p", "r"),
        15,
        _levels(STANDARD, LONG),
        multi_gpu,
        description="GPU peer-to-peer read capability per pair (OK, CNS, GNS, TNS, NS, ...)",
    ),
    # the PCIe tree as root sees it: the bridges (ACS on the switch ports between GPUs and NICs,
    # each port's bus range and link) and the NVIDIA/Mellanox adapters (their negotiated link);
    # lspci's -d filter keeps the output to those (an 8-GPU HGX has ~500 PCI functions, ~60
    # bridges: the whole -vvv listing is ~1 MB, the bridges ~250 KB)
    Probe(
        "lspci.bridges",
        ("lspci", "-vvv", "-D", "-d", "::0604"),
        15,
        _levels(STANDARD, LONG),
        gpus_or_nics,
        description="PCI bridges (lspci -vvv): ACS on the switch ports above GPUs and NICs",
    ),
    Probe(
        "lspci.nics",
        ("lspci", "-vvv", "-D", "-d", "15b3:"),
        15,
        _levels(STANDARD, LONG),
        any_nic,
        description="NVIDIA/Mellanox adapters (lspci -vvv): negotiated PCIe link width and speed",
    ),
    Probe(
        "slurmd-conf",
        ("slurmd", "-C"),
        30,
        _levels(STANDARD, LONG),
        slurm_compute,
        description="the CPUs and memory slurmd finds, against the NodeName line gpuctl wrote",
    ),
    # NVLink error counters, read twice around the GPU tests: growth is judged, never the
    # lifetime totals (a counter keeps what a link did since the driver loaded)
    Probe(
        "nvlink-errors.start",
        ("nvidia-smi", "nvlink", "-e"),
        30,
        _levels(STANDARD, LONG),
        nvlinked,
        description="NVLink error counters per link (replay, recovery, CRC), before the GPU tests",
    ),
    Probe(
        "nvlink-errors.end",
        ("nvidia-smi", "nvlink", "-e"),
        30,
        _levels(STANDARD, LONG),
        nvlinked,
        # last, with the InfiniBand counters: after nccl-tests, DCGM, the burn loop and the
        # multi-node runs of long (NCCL across nodes loads the NVLinks too)
        after=AFTER_PAIRS,
        description="NVLink error counters again, after the GPU tests and the multi-node runs",
    ),
    # InfiniBand port error counters, per HCA, read twice around every test of the level,
    # ib_write_bw between nodes included (each port of nics[].ports: on ConnectX-4 and later
    # each port is its own device, port 1)
    *_read_twice(
        "perfquery",
        ("perfquery", "-x", "-C", "{hca}", "-P", "{port}"),
        ib_nics,
        "InfiniBand port error counters (perfquery -x)",
        ("infiniband",),
    ),
    # RoCE ports' error counters (the kernel's hw_counters: out_of_sequence, local_ack_timeout_err,
    # ...), per adapter port, read twice like the InfiniBand ones
    *_read_twice(
        "rdma-stat",
        ("rdma", "statistic", "show", "link", "{hca}/{port}"),
        roce_nics,
        "RoCE port error counters (rdma statistic)",
        ("roce",),
    ),
    # each adapter port's physical layer after every test: bit error rates after FEC, mlxlink's
    # own diagnosis, the transceiver's readings against its own alarm thresholds (one read: a
    # BER is a rate since the counters were last cleared, not a count)
    Probe(
        "mlxlink",
        ("mlxlink", "-d", "{hca}", "-p", "{port}", "-m", "-c"),
        15,
        _levels(STANDARD, LONG),
        mft_nics,
        per_hca=True,
        nic_kinds=("infiniband", "roce"),
        # not on devices with several ports (ConnectX-3, ConnectX-3 Pro): MFT 4.26 and later
        # dropped the 4th-generation adapters (Mellanox/mstflint#590, its maintainers: "4th
        # generation adapters support was removed starting 4.26"; "-E- Unsupported device")
        multiport=False,
        after=AFTER_PAIRS,
        description="adapter port physical layer (mlxlink -m -c): BER, troubleshooting, module",
    ),
    Probe(
        "nccl",
        ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "{gpus}"),
        600,
        _levels(STANDARD, LONG),
        multi_gpu,
        exclusive=True,
        description="nccl-tests all_reduce over every GPU of the node: bus bandwidth, #wrong",
    ),
    # the other collectives training jobs run, each with its own busbw floor: all_gather and
    # reduce_scatter (FSDP, ZeRO), alltoall (expert parallelism: every GPU pair's path, where
    # one slow NVLink or NVSwitch port shows that a ring all_reduce hides), sendrecv (pipeline
    # parallelism); the same sizes, one after the other
    *(
        Probe(
            c.kind,
            (c.binary, "-b", "8", "-e", "8G", "-f", "2", "-g", "{gpus}"),
            NCCL_COLLECTIVE_TIMEOUT_S,
            _levels(STANDARD, LONG),
            multi_gpu,
            exclusive=True,
            description=f"nccl-tests {c.name} over every GPU of the node: bus bandwidth, #wrong",
        )
        for c in NCCL_COLLECTIVES
        if c.kind != "nccl"
    ),
    # host <-> GPU copies over each GPU's PCIe link: a link trained down, a GPU behind a slow
    # switch port, or IOMMU translation in the way shows here (the link state alone can look
    # fine); 64 MiB buffers, 3 samples each: seconds per GPU, CUDA's start-up included
    Probe(
        "nvbandwidth",
        (NVBANDWIDTH, "-t", NVBANDWIDTH_H2D, "-t", NVBANDWIDTH_D2H),
        60,
        _levels(STANDARD, LONG),
        nvbandwidth,
        exclusive=True,
        description="nvbandwidth: host-to-device and device-to-host copy bandwidth per GPU",
    ),
    # every GPU pair's copies over NVLink: a slow NVLink or NVSwitch port shows here for the
    # pairs through it (an all_reduce ring hides one); 56 pairs of 8 GPUs, a few seconds
    Probe(
        "nvbandwidth.d2d",
        (NVBANDWIDTH, "-t", NVBANDWIDTH_D2D_READ, "-t", NVBANDWIDTH_D2D_WRITE),
        60,
        _levels(STANDARD, LONG),
        nvswitch_peers,
        exclusive=True,
        description="nvbandwidth: GPU <-> GPU copy bandwidth of every pair (read and write)",
    ),
    Probe(
        "dcgm-diag",
        ("dcgmi", "diag", "-r", "2"),
        900,
        _levels(STANDARD),
        any_gpu,
        exclusive=True,
        description="DCGM diagnostics, level 2 (medium: deployment, PCIe, memory, ...)",
    ),
    Probe(
        "dcgm-diag",
        ("dcgmi", "diag", "-r", "3"),
        3600,
        frozenset({LONG}),
        any_gpu,
        exclusive=True,
        description="DCGM diagnostics, level 3 (long: adds targeted stress and power)",
    ),
    Probe(
        "dcgm-diag",
        ("dcgmi", "diag", "-r", "4"),
        BURN_DCGM_TIMEOUT_S,
        _levels(BURN),
        any_gpu,
        exclusive=True,
        description="DCGM diagnostics, level 4 (burn: adds the memory test and the pulse test)",
    ),
    # GPUDirect RDMA: each GPU's memory through its nearest adapter, a loopback on that adapter
    # (gpuctl/validation/gpudirect.py); where cluster.yml builds perftest with CUDA
    Probe(
        gpudirect.KIND_PREFIX,
        (),  # per GPU: gpudirect.server_argv, {hca} filled in when topo -m has been read
        gpudirect.TIMEOUT_S,
        _levels(STANDARD, LONG),
        lambda e: e.gpudirect is not None,
        exclusive=True,
        description="ib_write_bw --use_cuda per GPU on its nearest adapter (GPUDirect RDMA)",
        per_gpu=True,
    ),
    # the burn loop (gpuctl/validation/burn.py): for --duration, DCGM's targeted stress and
    # power tests one after the other with all_reduce_perf between them, while nvidia-smi dmon
    # samples every GPU; its own commands and outputs (``dmon``, ``dcgm-diag.burnN``,
    # ``nccl.burnN``, ``smi-xml.burn-start``/``-end``, ``xid.burn-end``), run by
    # gpuctl/validation/burn_collect.py; its time is the duration asked for, not in the budget
    Probe(
        "dmon",
        (),
        0,
        _levels(BURN),
        any_gpu,
        exclusive=True,
        description="the burn loop: DCGM targeted stress/power and all_reduce_perf for "
        "--duration, nvidia-smi dmon sampling every GPU",
        burn=True,
    ),
)


# What a plan depends on: every field of the expectation but the node's name and its
# thresholds (no probe's ``needs`` reads them, nor does any command), so nodes of one shape
# share one plan. The judges ask for a node's plan many times (``collects``): computed once.
_NOT_IN_PLAN = frozenset({"node", "thresholds", "sources"})
_PLAN_FIELDS = tuple(f.name for f in fields(NodeExpectation) if f.name not in _NOT_IN_PLAN)
_PLANS: dict[tuple[object, ...], tuple[tuple[Probe, ...], frozenset[str]]] = {}
_PLANS_MAX = 4096


def probes_for(exp: NodeExpectation, level: str | None = None) -> list[Probe]:
    """The probes one node runs at ``level`` (default: the node's own level from cluster.yml),
    light ones first, then the exclusive ones, then the second reads, in table order."""
    return list(_cached_plan(exp, level)[0])


def _cached_plan(
    exp: NodeExpectation, level: str | None
) -> tuple[tuple[Probe, ...], frozenset[str]]:
    """The node's plan at ``level`` and the kinds of its probes, made once per node shape."""
    lvl = level or exp.level
    if lvl not in LEVELS:
        raise ValueError(f"unknown level {lvl!r}; levels: {', '.join(LEVELS)}")
    key = (lvl, *(getattr(exp, name) for name in _PLAN_FIELDS))
    plan = _PLANS.get(key)
    if plan is None:
        probes = tuple(_plan(exp, lvl))
        plan = (probes, frozenset(p.kind for p in probes))
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _plan(exp: NodeExpectation, lvl: str) -> list[Probe]:
    chosen: list[Probe] = []
    for p in PROBES:
        if lvl in p.levels and p.needs(exp):
            chosen += _per_hca(p, exp) if p.per_hca else _per_gpu(p, exp) if p.per_gpu else [p]
    light, heavy, after_gpu, after_pairs = phases(chosen)
    return light + heavy + after_gpu + after_pairs


def _per_hca(probe: Probe, exp: NodeExpectation) -> list[Probe]:
    """One copy of ``probe`` per adapter port of the node of the probe's ``nic_kinds``
    (InfiniBand by default): ``{hca}`` (the device) and ``{port}`` filled in, kind
    ``<kind>.<name>`` (:attr:`ExpectedNic.name`: ``mlx5_0``, ``mlx4_0:2``)."""
    return [
        replace(
            probe,
            kind=f"{probe.kind}.{n.name}",
            argv=tuple(
                a.replace("{hca}", n.device).replace("{port}", str(n.port)) for a in probe.argv
            ),
            per_hca=False,
        )
        for n in exp.nics
        if n.kind in probe.nic_kinds and (probe.multiport or n.name == n.device)
    ]


def _per_gpu(probe: Probe, exp: NodeExpectation) -> list[Probe]:
    """One GPUDirect run per GPU of the node: kind ``perftest.gdr.gpu<index>``, the server's
    argv with ``{hca}`` for the adapter nearest the GPU (the client adds the node's address)."""
    method = exp.gpudirect or gpudirect.PEERMEM
    return [
        replace(
            probe,
            kind=gpudirect.kind(g),
            argv=gpudirect.server_argv(
                "{hca}", gpudirect.BASE_PORT + g, g, method, IB_WRITE_BW_SIZE
            ),
        )
        for g in range(exp.gpu_count)
    ]


def collects(exp: NodeExpectation, kind: str, level: str | None = None) -> bool:
    """Whether the node runs a probe whose output is ``kind`` at ``level`` (default: its own)."""
    return kind in _cached_plan(exp, level)[1]


def option(kind: str, flag: str, level: str | None = None) -> str | None:
    """The value the probe table passes after ``flag`` to the probe of ``kind`` (the first one
    that runs at ``level``, any level when None): ``-r`` of dcgmi diag, ``-e`` of nccl-tests."""
    for probe in PROBES:
        if probe.kind != kind or (level is not None and level not in probe.levels):
            continue
        if flag in probe.argv[:-1]:
            return probe.argv[probe.argv.index(flag) + 1]
    return None


def wants_ib_write_bw(exp: NodeExpectation, level: str | None = None) -> bool:
    """Whether the node takes part in ib_write_bw between nodes (and its judge applies)."""
    return any_nic(exp) and (level or exp.level) != QUICK


# ------------------------------------------------------------------------------------------
# ib_write_bw between two nodes (perftest): one server, one client per HCA


IB_WRITE_BW_BASE_PORT = 18515  # perftest's default out-of-band TCP port
IB_WRITE_BW_SIZE = 8 * 1024 * 1024  # 8 MiB messages, as the floors in data/fabrics.yml
IB_WRITE_BW_TIMEOUT_S = 60
# How long the client waits for the server to print perftest's "Waiting for client" banner.
IB_WRITE_BW_SERVER_START_S = 15
SERVER_READY = "Waiting for client to connect"


def ib_port(hca: str) -> tuple[str, str]:
    """perftest's ``-d DEVICE`` for an adapter port's name (``mlx5_0``, ``mlx4_0:2``: its port
    is :func:`perftest_options`' ``-i``)."""
    return ("-d", split_port(hca)[0])


def ib_write_bw_server(hca: str, port: int, options: Sequence[str] = ()) -> tuple[str, ...]:
    """The server side on the adapter port ``hca`` (:attr:`ExpectedNic.name`), ``port`` its
    TCP port; ``options``: :func:`perftest_options` of its adapter."""
    return (
        "ib_write_bw",
        *ib_port(hca),
        "-p",
        str(port),
        "-s",
        str(IB_WRITE_BW_SIZE),
        "-F",
        "--report_gbits",
        *options,
    )


def ib_write_bw_client(
    hca: str, port: int, server_address: str, options: Sequence[str] = ()
) -> tuple[str, ...]:
    return (*ib_write_bw_server(hca, port, options), server_address)


def perftest_options(nic: ExpectedNic | None) -> tuple[str, ...]:
    """perftest's addressing of an adapter port: the port of a device with several (``-i``,
    "--ib-port", port 1 when not given); on RoCE the GID index (``-x``, cluster.yml's
    ``fabrics[].gid_index``) and the traffic class (``--tclass``, DSCP << 2: the lossless
    class, as NCCL_IB_TC)."""
    if nic is None:
        return ()
    out: tuple[str, ...] = ()
    if nic.name != nic.device:
        out += ("-i", str(nic.port))
    if nic.gid_index is not None:
        out += ("-x", str(nic.gid_index))
    if nic.traffic_class is not None:
        out += (f"--tclass={nic.traffic_class}",)
    return out


def perftest_kind(hca: str) -> str:
    """The bundle name of one HCA's ib_write_bw output (``perftest-<hca>.txt``)."""
    return f"perftest-{hca}"


# ib_write_lat on the same pairs, right after each HCA's ib_write_bw: perftest's defaults
# (2-byte writes, 1,000 iterations), -F as above; both sides print the result table
# (linux-rdma/perftest src/write_lat.c calls print_report_lat on server and client alike)
IB_WRITE_LAT_PORT_OFFSET = 1024  # its port: the ib_write_bw run's + 1024
IB_WRITE_LAT_TIMEOUT_S = 30
LAT_PREFIX = "perftest.lat."


def ib_write_lat_server(hca: str, port: int, options: Sequence[str] = ()) -> tuple[str, ...]:
    """The latency test's server side on ``hca`` (``options``: :func:`perftest_options`)."""
    return ("ib_write_lat", *ib_port(hca), "-p", str(port), "-F", *options)


def ib_write_lat_client(
    hca: str, port: int, server_address: str, options: Sequence[str] = ()
) -> tuple[str, ...]:
    return (*ib_write_lat_server(hca, port, options), server_address)


def latency_kind(hca: str) -> str:
    """The bundle name of one HCA's ib_write_lat output (``perftest.lat.<hca>.txt``)."""
    return f"{LAT_PREFIX}{hca}"


def wants_ib_write_lat(exp: NodeExpectation, level: str | None = None) -> bool:
    """Whether the node's pairs also run ib_write_lat (an ``ib_write_lat_p99_us`` is set)."""
    return wants_ib_write_bw(exp, level) and exp.thresholds.get("ib_write_lat_p99_us") is not None
