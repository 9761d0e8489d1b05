"""Benchmark outputs for a simulated node: nccl-tests ``all_reduce_perf`` and perftest
``ib_write_bw`` (client and server). Bandwidths come from the profile's ``expected`` numbers and
the faults. Layouts are copied from tests/fixtures/nccl-tests and tests/fixtures/perftest.
Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .common import Faults, Hca, Profile, digest, fabric_ok, hcas, nccl_factor, visible_gpus
from .ib import port_traffic
from .load import nccl_drift

NCCL_TESTS_VERSION = "2.17.9"
NCCL_CODE = "22602"  # NCCL 2.26.2
GIB8 = 8 << 30
LATENCY_US = 28.0
LATENCY_NET_US = 64.0  # across nodes (InfiniBand hops)


class ToolFailure(Exception):
    """The tool's failure output (printed as is on stderr), its exit status, and what it had
    printed on stdout before it failed."""

    def __init__(self, output: str, status: int = 1, stdout: str = "") -> None:
        super().__init__(output)
        self.output = output
        self.status = status
        self.stdout = stdout


def parse_size(text: str) -> int:
    """nccl-tests / perftest sizes: ``8``, ``64K``, ``8M``, ``8G``."""
    match = re.fullmatch(r"(\d+)([KkMmGg]?)[Bb]?", text.strip())
    if not match:
        raise ValueError(f"invalid size {text!r}")
    shift = {"": 0, "k": 10, "m": 20, "g": 30}[match.group(2).lower()]
    return int(match.group(1)) << shift


# ------------------------------------------------------------------------------------------
# all_reduce_perf


@dataclass(frozen=True, slots=True)
class NcclArgs:
    min_bytes: int = 32 << 20
    max_bytes: int = 32 << 20
    factor: int = 2
    gpus: int = 1
    iters: int = 20
    warmup: int = 1
    check: int = 1
    dtype: str = "float"
    op: str = "sum"


_TYPE_SIZE = {"int8": 1, "uint8": 1, "half": 2, "bfloat16": 2, "float": 4, "int32": 4, "double": 8}


@dataclass(frozen=True, slots=True)
class Collective:
    """How nccl-tests v2.17.9 sizes, names and scores one collective (src/<name>.cu:
    GetCollByteCount, GetBw, the op name RunTest passes to TimeTest)."""

    name: str
    op: str | None  # the redop column; None: the -o option (all_reduce, reduce_scatter, sendrecv)
    split: bool  # each rank's share is count / ranks, rounded down to 16 bytes
    bus: str  # "allreduce": 2(n-1)/n, "nm1": (n-1)/n, "one": 1
    in_place_checked: bool = True  # sendrecv does not check its in-place results ("N/A")


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all_reduce", None, False, "allreduce"),
        Collective("all_gather", "none", True, "nm1"),
        Collective("reduce_scatter", None, True, "nm1"),
        Collective("alltoall", "none", True, "nm1"),
        Collective("sendrecv", None, False, "one", in_place_checked=False),
    )
}


def bus_factor(coll: Collective, n: int) -> float:
    if coll.bus == "allreduce":
        return 2.0 * (n - 1) / n
    return (n - 1) / n if coll.bus == "nm1" else 1.0


def target_busbw(profile: Profile, faults: Faults, name: str) -> float:
    """The busbw at 8 GiB a node of ``profile`` reaches in ``name`` with these faults."""
    expected = profile["expected"]
    value = float(expected.get(f"nccl_{name}_busbw_gbs") or expected["nccl_all_reduce_busbw_gbs"])
    slow = faults.get("nccl_collective_slow") or {}
    return value * nccl_factor(profile, faults) * float(slow.get(name, 1.0))


def all_reduce_perf(profile: Profile, faults: Faults, node: str, args: NcclArgs) -> str:
    """The output of a single-node all_reduce_perf run; raises ToolFailure as nccl-tests
    fails."""
    return nccl_perf(profile, faults, node, args, "all_reduce")


def nccl_perf(profile: Profile, faults: Faults, node: str, args: NcclArgs, collective: str) -> str:
    """The output of a single-node run of ``<collective>_perf``; raises ToolFailure as
    nccl-tests fails."""
    gpus = visible_gpus(profile, faults, node)
    pid = 10_000 + digest(node, "pid") % 50_000
    if args.gpus > len(gpus):
        raise ToolFailure(
            f"{node}: Test CUDA failure common.cu:1030 'invalid device ordinal'\n"
            f" .. {node} pid {pid}: Test failure common.cu:891\n"
        )
    if not fabric_ok(profile, faults):
        raise ToolFailure(
            f"{node}: Test CUDA failure common.cu:1030 'system not yet initialized'\n"
            f" .. {node} pid {pid}: Test failure common.cu:891\n"
        )
    n = args.gpus
    target = target_busbw(profile, faults, collective)
    if collective == "all_reduce":  # after stress runs, with the nccl_drift fault (lab.sim.load)
        target *= nccl_drift(faults, node)
    ranks = []
    for rank, gpu in enumerate(gpus[:n]):
        busid = gpu.bus_id[4:].removesuffix(".0").lower()  # %04x:%02x:%02x: 0000:18:00
        ranks.append(
            f"#  Rank {rank:>2} Group  0 Pid {pid:>6} on {node:>10} device {rank:>2} "
            f"[{busid}] {gpu.name}"
        )
    wrong = int(faults.get("nccl_wrong") or 0)
    return _render(args, n, target, node, ranks, wrong, coll=COLLECTIVES[collective])


def all_reduce_perf_ranks(args: NcclArgs, states: list[dict[str, Any]], per_node: int) -> str:
    """Rank 0's output of a run across nodes (one process per GPU, ``-g 1``): ``states`` are
    the nodes' reports (lab.sim.ranks), the busbw that of the slowest node. Raises ToolFailure
    with a node's failure line when one cannot run."""
    failures = [str(s["error"]) for s in states if s.get("error")]
    if failures:
        head = str(states[0].get("node"))
        raise ToolFailure(
            "\n".join(failures)
            + f"\n .. {head} pid {states[0].get('pid')}: Test failure common.cu:891\n"
        )
    n = per_node * args.gpus * len(states)
    ranks = []
    for index, state in enumerate(states):
        gpus = list(state.get("gpus") or [])
        pid = int(state.get("pid") or 0)  # one process per srun task, -g GPUs each
        for local in range(per_node * args.gpus):
            rank = index * per_node * args.gpus + local
            gpu = gpus[local] if local < len(gpus) else {"busid": "?", "name": "?"}
            ranks.append(
                f"#  Rank {rank:>2} Group  0 Pid {pid + local // args.gpus:>6} on "
                f"{state.get('node')!s:>10} device {local:>2} [{gpu['busid']}] {gpu['name']}"
            )
    target = min(float(s.get("capacity") or 0.0) for s in states)
    wrong = max(int(s.get("wrong") or 0) for s in states)
    return _render(args, n, target, str(states[0].get("node")), ranks, wrong, LATENCY_NET_US)


def _render(
    args: NcclArgs,
    n: int,
    target: float,
    seed: str,
    ranks: list[str],
    wrong: int,
    latency_us: float = LATENCY_US,
    coll: Collective = COLLECTIVES["all_reduce"],
) -> str:
    """nccl-tests v2.17.9's output of ``coll`` on ``n`` ranks whose busbw at 8 GiB is
    ``target`` GB/s (src/util.cu: writeDeviceReport, writeResultHeader, the benchmark lines,
    writeResultFooter)."""
    factor = bus_factor(coll, n)
    # peak algbw (GB/s = bytes/ns) chosen so that busbw at 8 GiB is exactly the target
    if factor and target > 0:
        alg_at_8g = target / factor
        peak = GIB8 / (GIB8 / alg_at_8g - latency_us * 1e3)
    else:
        peak = 900.0  # one GPU: a device-local copy
    program = f"{coll.name}_perf"
    lines = [
        f"# nccl-tests version {NCCL_TESTS_VERSION} nccl-headers={NCCL_CODE} "
        f"nccl-library={NCCL_CODE}",
        f"# Collective test starting: {program}",
        f"# nThread 1 nGpus {args.gpus} minBytes {args.min_bytes} maxBytes {args.max_bytes} "
        f"step: {args.factor}(factor) warmup iters: {args.warmup} iters: {args.iters} "
        f"agg iters: 1 validation: {args.check} graph: 0",
        "#",
        "# Using devices",
        *ranks,
    ]
    lines += [
        "#",
        "#                                                              out-of-place"
        "                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw"
        "  #wrong     time   algbw   busbw  #wrong ",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
        "             (us)  (GB/s)  (GB/s)         ",
    ]
    elem = _TYPE_SIZE.get(args.dtype, 4)
    op = coll.op or args.op
    size = args.min_bytes
    total_bus = 0.0
    rows = 0
    wrong_total = 0
    while True:
        count = size // elem
        if coll.split:  # count/nranks, rounded down to 16 bytes (16/eltSize elements)
            param = (count // n) & -max(1, 16 // elem)
            moved = param * n * elem
        else:
            param = count
            moved = count * elem
        cells = []
        for place in ("out", "in"):
            time_us = latency_us + moved / (peak * 1e3)
            time_us *= 1.0 + (digest(seed, size, place) % 200 - 100) / 10_000.0
            algbw = moved / (time_us * 1e3)
            busbw = algbw * factor
            if place == "out":
                total_bus += busbw
            checked = args.check and (place == "out" or coll.in_place_checked)
            bad = wrong if wrong and moved >= (1 << 20) and checked else 0
            wrong_total += bad
            check = f"{bad:>6g}" if checked else "   N/A"
            cells.append(
                f"  {_float_str(time_us, 7)}  {_float_str(algbw, 6)}  {_float_str(busbw, 6)}"
                f"  {check}"
            )
        lines.append(
            f"{moved:>12}  {param:>12}  {args.dtype:>8}  {op:>6}  {-1:>6}" + "".join(cells)
        )
        rows += 1
        following = size * args.factor
        if args.factor < 2 or following > args.max_bytes:
            break
        size = following
    avg = total_bus / rows if rows else 0.0
    lines += [
        f"# {'Out of bounds values':<20} : {wrong_total} {'FAILED' if wrong_total else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {avg:g} ",
        "#",
        f"# Collective test concluded: {program}",
        "",
    ]
    return "\n".join(lines)


def _float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr (src/util.cu): two decimals while they fit in ``width``."""
    power = 0
    bound = 1
    while value >= bound:
        power += 1
        bound *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def nccl_exit_status(faults: Faults) -> int:
    return 1 if faults.get("nccl_wrong") else 0


# ------------------------------------------------------------------------------------------
# ib_write_bw

_DASHES = "-" * 87


@dataclass(frozen=True, slots=True)
class PerftestArgs:
    server: str | None = None  # None: this is the server side
    device: str | None = None
    size: int = 65536
    all_sizes: bool = False
    iterations: int = 5000
    qps: int = 1
    gbits: bool = False
    port: int = 18515  # -p: the TCP port of the out-of-band exchange
    gid_index: int | None = None  # -x; RoCE without it: 0 (perftest's usage: "ETH - 0")
    title: str = "RDMA_Write BW Test"  # ib_read_bw: RDMA_Read BW Test, ib_send_bw: Send BW Test
    cuda: int | None = None  # --use_cuda=N (a perftest built with CUDA): the buffer on GPU N
    dmabuf: bool = False  # --use_cuda_dmabuf: registered through DMA-BUF


def _curve(size: int) -> float:
    return size / (size + 2600.0)


def peak_gbps(profile: Profile, faults: Faults, hca: Hca) -> float:
    """Average Gb/s this HCA reaches with 8 MiB messages (its share of a two-node run)."""
    expected = profile["expected"].get("ib_write_bw_gbps") or 0.0
    scale = hca.rate / hca.max_rate * float(faults.get("slow_node") or 1.0)
    return float(expected) * scale


def ib_write_bw_gbps(
    profile: Profile, faults: Faults, hca: Hca, size: int, limit: float | None = None
) -> float:
    """Average Gb/s this HCA reaches with messages of ``size`` bytes (``limit``: the peer's
    8 MiB bandwidth, when it is the slower side)."""
    peak = peak_gbps(profile, faults, hca)
    if limit is not None:
        peak = min(peak, limit)
    return peak * _curve(size) / _curve(8 << 20)


def pick(profile: Profile, faults: Faults, node: str, args: PerftestArgs) -> Hca:
    """The HCA of ``-d`` (raises ToolFailure as perftest fails when it is missing or down)."""
    return _pick(profile, faults, node, args)


def _pick(profile: Profile, faults: Faults, node: str, args: PerftestArgs) -> Hca:
    devices = hcas(profile, faults, node)
    if not devices:
        raise ToolFailure(" No IB devices found\n Unable to find the Infiniband/RoCE device\n")
    chosen = devices[0] if args.device is None else None
    for hca in devices:
        if hca.name == args.device:
            chosen = hca
    if chosen is None:
        raise ToolFailure(
            f" IB device {args.device} not found\n Unable to find the Infiniband/RoCE device\n"
        )
    if not chosen.active:
        raise ToolFailure(
            f" Port number 1 state is {chosen.state}\n"
            " Couldn't set the link layer\n"
            " Couldn't get context for the device\n"
        )
    return chosen


def cuda_setup(profile: Profile, faults: Faults, node: str, args: PerftestArgs) -> str:
    """What a perftest built with CUDA prints on stdout before the test for ``--use_cuda=N``
    (src/cuda_memory.c of perftest 25.x, as in the --use_cuda fixtures of
    tests/fixtures/perftest): the CUDA devices in PCI bus order, the one picked, the buffer.
    Raises ToolFailure where GPU N does not exist, or where the adapter cannot register its
    memory (fault ``gpudirect_broken``: as without nvidia-peermem)."""
    gpus = visible_gpus(profile, faults, node)
    lines = ["Perftest doesn't supports CUDA tests with inline messages: inline size set to 0"]
    lines += ["initializing CUDA", "Listing all CUDA devices in system:"]
    lines += [f"CUDA device {g.index}: PCIe address is {g.bus_id[9:14].upper()}" for g in gpus]
    lines.append("")
    chosen = next((g for g in gpus if g.index == args.cuda), None)
    if chosen is None:
        raise ToolFailure(
            f"No CUDA device with index {args.cuda}\n Couldn't create IB resources\n",
            stdout="\n".join(lines) + "\n",
        )
    pid = 4000 + digest(node, "pid", args.port) % 50000
    address = 0x7F0000000000 + (digest(node, "buffer", chosen.index) % 0xFFFF) * 0x200000
    size = 2 * args.size
    lines += [
        f"Picking device No. {chosen.index}",
        f"[pid = {pid}, dev = {chosen.index}] device name = [{chosen.name}]",
        "creating CUDA Ctx",
        "making it the current CUDA Ctx",
        "CUDA device integrated: 0",
    ]
    if args.dmabuf:
        lines.append(
            f"using DMA-BUF for GPU buffer address at {address:#x} aligned at {address:#x} "
            f"with aligned size {size}"
        )
    lines.append(
        f"allocated GPU buffer of a {size} address at {address + 0x9300:#x} for type "
        "CUDA_MEM_DEVICE"
    )
    broken = faults.get("gpudirect_broken")
    if broken is not None and (broken == "all" or chosen.physical in broken):
        error = "Couldn't allocate MR with error=14" if args.dmabuf else "Couldn't allocate MR"
        raise ToolFailure(
            f"{error}\nfailed to create mr\nFailed to create MR\n Couldn't create IB resources\n"
            "destroying current CUDA Ctx\n",
            stdout="\n".join(lines) + "\n",
        )
    if args.dmabuf:
        lines.append(
            f"Calling ibv_reg_dmabuf_mr(offset=0, size={size}, addr={address:#x}, fd=39) for QP #0"
        )
    return "\n".join(lines) + "\n"


def cuda_teardown(node: str, args: PerftestArgs) -> str:
    """What a perftest built with CUDA prints after the table."""
    address = 0x7F0000000000 + (digest(node, "buffer", args.cuda) % 0xFFFF) * 0x200000
    return f"deallocating GPU buffer {address:016x}\ndestroying current CUDA Ctx\n"


def _settings(
    hca: Hca,
    args: PerftestArgs,
    title: str,
    qps: int,
    relax: str,
    middle: list[str],
    inline: int,
) -> list[str]:
    """perftest's header from the title to the settings' closing dashes: ``middle``, the
    test's own lines after ``ibv_wr* API``; the GID index only on Ethernet."""
    ethernet = hca.link_layer == "Ethernet"
    gid = [f" GID index       : {args.gid_index or 0}"] if ethernet else []
    return [
        _DASHES,
        f"                    {title}",
        f" Dual-port       : OFF          Device         : {hca.name}",
        f" Number of qps   : {qps:<13}Transport type : IB",
        " Connection type : RC           Using SRQ      : OFF",
        f" PCIe relax order: {relax}",
        " ibv_wr* API     : ON",
        *middle,
        f" Mtu             : {'1024' if ethernet else '4096'}[B]",
        f" Link type       : {hca.link_layer if ethernet else 'IB'}",
        *gid,
        f" Max inline data : {inline}[B]",
        " rdma_cm QPs     : OFF",
        " Data ex. method : Ethernet",
        _DASHES,
    ]


WAITING = (
    "\n************************************\n"
    "* Waiting for client to connect... *\n"
    "************************************\n"
)


def ib_write_bw(
    profile: Profile,
    faults: Faults,
    node: str,
    args: PerftestArgs,
    peer: Mapping[str, Any] | None = None,
) -> str:
    """The tool's output (the server's with the waiting banner first). ``peer``: the other
    side's state from the exchange (``peak_gbps``, ``lid``), which limits the bandwidth."""
    hca = _pick(profile, faults, node, args)
    cuda = cuda_setup(profile, faults, node, args) if args.cuda is not None else ""
    port_traffic(faults, node, hca.name)  # the run counts in the port's counters
    limit = float(peer["peak_gbps"]) if peer is not None else None
    remote_lid = int(peer["lid"]) if peer is not None else hca.lid + 1
    ethernet = hca.link_layer == "Ethernet"
    unit = "Gb/sec" if args.gbits else "MB/sec"
    middle = [" TX depth        : 128", " CQ Moderation   : 1"]
    head = _settings(hca, args, args.title, args.qps, "ON", middle, inline=0)
    seed = digest(node, hca.name, "qpn")
    for qp in range(args.qps):
        lid = "0000" if ethernet else f"{hca.lid:#06x}"
        psn = digest(node, "psn", qp) & 0xFFFFFF
        head.append(f" local address: LID {lid} QPN {(seed + qp) & 0xFFFF:#06x} PSN {psn:#08x}")
        if ethernet:
            head.append(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:10")
    for qp in range(args.qps):
        lid = "0000" if ethernet else f"{remote_lid:#06x}"
        psn = digest(node, "rpsn", qp) & 0xFFFFFF
        head.append(
            f" remote address: LID {lid} QPN {(seed + 0x40 + qp) & 0xFFFF:#06x} PSN {psn:#08x}"
        )
        if ethernet:
            head.append(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:11")
    head += [
        _DASHES,
        f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]",
    ]
    sizes = [2 << i for i in range(23)] if args.all_sizes else [args.size]
    for size in sizes:
        gbps = ib_write_bw_gbps(profile, faults, hca, size, limit)
        peak = gbps * 1.0004
        rate = gbps * 1e9 / 8 / size / 1e6
        if not args.gbits:
            gbps, peak = gbps * 1000 / 8, peak * 1000 / 8
        head.append(
            f" {size:<7}    {args.iterations:<7}          {peak:<7.2f}            {gbps:<7.2f}"
            f"            {rate:.6f}"
        )
    head.append(_DASHES)
    text = cuda + "\n".join(head) + "\n"
    if args.cuda is not None:
        text += cuda_teardown(node, args)
    if args.server is None:
        return WAITING + text
    return text


# ------------------------------------------------------------------------------------------
# ib_write_lat

# perftest src/perftest_parameters.h: RESULT_FMT_LAT (the header, its trailing blank included)
# and REPORT_FMT_LAT (a row: its tabs as perftest prints them)
_LAT_HEADER = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
    "t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
)
_LAT_ROW = (
    " {size:<7} {iters}          {t_min:<7.2f}        {t_max:<7.2f}      {typical:<7.2f}  "
    "\t       {avg:<7.2f}     \t{stdev:<7.2f}\t\t{p99:<7.2f} \t\t{p999:<7.2f}"
)
# one-way latency of a 2-byte RDMA write across one switch (us): the DGX Spark capture of
# tests/fixtures/perftest shows 1.47 typical, 1.57 at the 99th percentile on a 200G port
LAT_TYPICAL_US = {"InfiniBand": 1.10, "Ethernet": 1.47}


def lat_extra_us(faults: Faults, hca: Hca) -> float:
    """Microseconds fault ``ib_latency`` adds to every write through ``hca``."""
    return float((faults.get("ib_latency") or {}).get(hca.name, 0.0))


def ib_write_lat(
    profile: Profile,
    faults: Faults,
    node: str,
    args: PerftestArgs,
    peer: Mapping[str, Any] | None = None,
) -> str:
    """ib_write_lat's output (the server's with the waiting banner first): both sides print
    the same table (src/write_lat.c), the latency of the link both ends add to."""
    hca = _pick(profile, faults, node, args)
    ethernet = hca.link_layer == "Ethernet"
    extra = lat_extra_us(faults, hca) + float((peer or {}).get("lat_extra_us") or 0.0)
    typical = LAT_TYPICAL_US["Ethernet" if ethernet else "InfiniBand"] + extra
    remote_lid = int(peer["lid"]) if peer is not None else hca.lid + 1
    # the server side prints no TX depth (the Soft-RoCE server capture of tests/fixtures)
    middle = [" TX depth        : 1"] if args.server is not None else []
    head = _settings(hca, args, "RDMA_Write Latency Test", 1, "OFF", middle, inline=220)
    seed = digest(node, hca.name, "lat-qpn")
    lid = "0000" if ethernet else f"{hca.lid:#06x}"
    rlid = "0000" if ethernet else f"{remote_lid:#06x}"
    head.append(
        f" local address: LID {lid} QPN {seed & 0xFFFF:#06x} PSN {seed >> 8 & 0xFFFFFF:#08x}"
    )
    head.append(
        f" remote address: LID {rlid} QPN {(seed + 0x40) & 0xFFFF:#06x} "
        f"PSN {seed >> 4 & 0xFFFFFF:#08x}"
    )
    head += [_DASHES, _LAT_HEADER]
    head.append(
        _LAT_ROW.format(
            size=2,
            iters=1000,
            t_min=typical - 0.05,
            t_max=typical + 0.46,
            typical=typical,
            avg=typical,
            stdev=0.0,
            p99=typical + 0.10,
            p999=typical + 0.46,
        )
    )
    head.append(_DASHES)
    text = "\n".join(head) + "\n"
    if args.server is None:
        return WAITING + text
    return text
