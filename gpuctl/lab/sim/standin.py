"""The one entry point behind every stand-in command inside a lab node.

The lab installs /usr/bin/nvidia-smi, /usr/bin/ibstat, ... as small launchers that call
:func:`main` with the command's name. It reads the node's hardware profile (JSON, written by the
lab from gpuctl/lab/profiles/<name>.yml) and its injected faults, prints what the real tool would
print and returns the real tool's exit status. Standard library only, relative imports only:
the lab copies this package into the node under any package name.

Paths (environment overrides, used by tests):
  GPUCTL_SIM_PROFILE  /etc/gpuctl-lab/hardware.json
  GPUCTL_SIM_FAULTS   /var/lib/gpuctl-lab-sim/faults.json (absent file: no faults)
  GPUCTL_SIM_NODE     the node name (default: the host name)
  GPUCTL_SIM_ROOT     the root the driver's version files are under (default /; see .driver)
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from . import (
    dcgm,
    driver,
    fabric,
    ib,
    kernel,
    load,
    mft,
    mlxlink,
    nvbandwidth,
    nvsmi,
    nvsmi_xml,
    pci,
    peer,
    perf,
    qos,
    ranks,
)
from .common import Faults, Profile, visible_gpus
from .faults import FaultError, validate

PROFILE_PATH = "/etc/gpuctl-lab/hardware.json"
FAULTS_PATH = "/var/lib/gpuctl-lab-sim/faults.json"
TOOLS = (
    "nvidia-smi",
    "ibstat",
    "perfquery",
    "ibv_devinfo",
    "ibdev2netdev",
    "all_reduce_perf",
    "all_gather_perf",
    "reduce_scatter_perf",
    "alltoall_perf",
    "sendrecv_perf",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "dcgmi",
    "nv-fabricmanager",
    "nvidia-persistenced",
    "nv-hostengine",
    "dmesg",
    "mlxfwmanager",
    "flint",
    "mlxlink",
    "mlnx_qos",
    "nvbandwidth",
    "lspci",
    "rdma",
)


class _Out:
    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        self.stdout = stdout
        self.stderr = stderr

    def out(self, text: str) -> None:
        self.stdout.write(text)

    def err(self, text: str) -> None:
        self.stderr.write(text)


def load_state() -> tuple[Profile, Faults]:
    """The node's profile, with the driver versions it runs now (:func:`.driver.effective_profile`),
    and its faults (raises OSError/ValueError/FaultError when unreadable)."""
    profile_path = os.environ.get("GPUCTL_SIM_PROFILE", PROFILE_PATH)
    faults_path = os.environ.get("GPUCTL_SIM_FAULTS", FAULTS_PATH)
    with open(profile_path, encoding="utf-8") as handle:
        profile = json.load(handle)
    if not isinstance(profile, dict):
        raise ValueError(f"{profile_path}: not a JSON object")
    faults: Any = {}
    if os.path.exists(faults_path):
        with open(faults_path, encoding="utf-8") as handle:
            text = handle.read()
        faults = json.loads(text) if text.strip() else {}
    if not isinstance(faults, dict):
        raise ValueError(f"{faults_path}: not a JSON object")
    return driver.effective_profile(profile), validate(faults)


def node_name() -> str:
    return os.environ.get("GPUCTL_SIM_NODE") or socket.gethostname().split(".")[0]


def main(
    argv0_name: str,
    args: Sequence[str],
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run stand-in ``argv0_name`` (any path; its base name picks the tool) with ``args``."""
    io = _Out(stdout or sys.stdout, stderr or sys.stderr)
    tool = os.path.basename(argv0_name)
    handler = _HANDLERS.get(tool)
    if handler is None:
        io.err(f"gpuctl-lab-sim: no stand-in for {tool!r} (known: {', '.join(TOOLS)})\n")
        return 127
    try:
        profile, faults = load_state()
    except (OSError, ValueError, FaultError) as exc:
        io.err(f"gpuctl-lab-sim: cannot read the simulated hardware: {exc}\n")
        return 2
    return handler(profile, faults, node_name(), list(args), io)


def run() -> int:
    """``main`` with this process's own argv (what the node's launchers call)."""
    return main(sys.argv[0], sys.argv[1:])


def launcher(lib_dir: str, package: str) -> str:
    """The text of /usr/bin/<tool> inside a node, the package copied to ``lib_dir/package``."""
    return (
        "#!/usr/bin/python3\n"
        "# gpuctl lab: simulated hardware (see docs/lab-hardware.md)\n"
        "import sys\n"
        f"sys.path.insert(0, {lib_dir!r})\n"
        f"from {package}.standin import run\n"
        "sys.exit(run())\n"
    )


# ------------------------------------------------------------------------------------------
# nvidia-smi

_SMI_USAGE = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
_SMI_HELP = """\
NVIDIA System Management Interface -- v{driver}

NVSMI provides monitoring information for Tesla and select Quadro devices.
The data is presented in either a plain text or an XML format, via stdout or a file.

Supported in this simulated node (gpuctl lab):
    nvidia-smi                      the summary table
    nvidia-smi -L                   list GPUs
    nvidia-smi -q [-i ID]           query (plain text)
    nvidia-smi -q -x [-i ID]        query (XML)
    nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits] [-i ID]
    nvidia-smi topo -m
    nvidia-smi nvlink -s [-i ID]
    nvidia-smi nvlink -e [-i ID]
"""


def _smi(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    drv = driver.read(profile)
    if args in (["-h"], ["--help"]):  # no NVML needed
        io.out(_SMI_HELP.format(driver=drv.library))
        return 0
    failure = drv.smi_failure()  # NVML does not start: module not loaded, or not this version
    if failure is not None:
        io.out(failure[0])
        return failure[1]
    if not visible_gpus(profile, faults, node):
        io.out("No devices were found\n")
        return 6
    if args[:1] == ["dmon"]:  # the GPUs over time (lab.sim.load)
        return load.dmon_main(profile, faults, node, args[1:], io.out, io.err)
    if args[:1] == ["topo"]:
        if args[1:] in (["-m"], ["--matrix"]):
            io.out(nvsmi.topo(profile, faults, node))
            return 0
        if args[1:2] == ["-p2p"] and len(args) == 3 and args[2] in nvsmi.P2P_CAPS:
            io.out(nvsmi.topo_p2p(profile, faults, node))
            return 0
        io.out(_SMI_USAGE)
        return 2
    index: int | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-i", "--id") and i + 1 < len(args):
            value = args[i + 1]
            i += 2
        elif arg.startswith("--id="):
            value = arg.split("=", 1)[1]
            i += 1
        else:
            rest.append(arg)
            i += 1
            continue
        if not value.isdigit():
            io.out(f"No devices were found with ID {value}\n")  # bus ids/UUIDs: not simulated
            return 6
        index = int(value)
        if index >= len(visible_gpus(profile, faults, node)):
            io.out("No devices were found\n")
            return 6
    if rest[:1] == ["nvlink"]:
        if rest[1:] in (["-s"], ["--status"]):
            io.out(nvsmi.nvlink_status(profile, faults, node, index))
            return 0
        if rest[1:] in (["-e"], ["--errorcounters"]):
            io.out(nvsmi.nvlink_errors(profile, faults, node, index))
            return 0
        io.out(_SMI_USAGE)
        return 2
    if not rest:
        io.out(nvsmi.table(profile, faults, node))
        return 0
    if rest in (["-h"], ["--help"]):
        io.out(_SMI_HELP.format(driver=drv.library))
        return 0
    if rest in (["-L"], ["--list-gpus"]):
        io.out(nvsmi.listing(profile, faults, node))
        return 0
    query, xml = {"-q", "--query", "-a"}, {"-x", "--xml-format"}
    if (
        query & set(rest)
        and xml & set(rest)
        and all(a in query | xml or a.startswith(("-d", "--display")) for a in rest)
    ):
        io.out(nvsmi_xml.query_xml(profile, faults, node, only=index))
        return 0
    if rest in (["-q"], ["--query"], ["-a"]) or (
        rest[:1] in (["-q"], ["--query"])
        and all(a.startswith(("-d", "--display")) for a in rest[1:])
    ):
        io.out(nvsmi.query(profile, faults, node, only=index))
        return 0
    return _smi_csv(profile, faults, node, rest, index, io)


def _smi_csv(
    profile: Profile, faults: Faults, node: str, rest: list[str], index: int | None, io: _Out
) -> int:
    fields: list[str] | None = None
    fmt: list[str] | None = None
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, eq, value = arg.partition("=")
        if name in ("--query-gpu", "--format") and not eq and i + 1 < len(rest):
            value, i = rest[i + 1], i + 1
        if name == "--query-gpu":
            fields = [f.strip() for f in value.split(",") if f.strip()]
        elif name == "--format":
            fmt = [f.strip() for f in value.split(",")]
        else:
            io.out(_SMI_USAGE)
            return 2
        i += 1
    if fields is None or fmt is None or "csv" not in fmt:
        io.out(_SMI_USAGE if fields is None else "--format must be given with csv\n\n")
        return 2
    try:
        text = nvsmi.query_csv(
            profile, faults, node, fields, header="noheader" not in fmt, units="nounits" not in fmt
        )
    except nvsmi.QueryError as exc:
        io.out(f"{exc}\n{_SMI_USAGE}")
        return 2
    if index is not None:
        lines = text.splitlines()
        skip = 0 if "noheader" in fmt else 1
        text = "\n".join([*lines[:skip], lines[skip + index]]) + "\n"
    io.out(text)
    return 0


# ------------------------------------------------------------------------------------------
# InfiniBand tools


def _ib_out(io: _Out, render: Callable[[], str]) -> int:
    """Print what an InfiniBand tool prints, or its error and exit status (ib.IbError)."""
    try:
        io.out(render())
    except ib.IbError as exc:
        io.err(exc.message)
        return exc.status
    return 0


def _perfquery(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    """``perfquery -x -C <ca> [-P <port>]``: what validation runs; anything else is refused."""
    rest = list(args)
    device, port = None, "1"
    if rest[:1] == ["-x"]:
        rest = rest[1:]
        if rest[:1] == ["-C"] and len(rest) >= 2:
            device, rest = rest[1], rest[2:]
        if rest[:1] == ["-P"] and len(rest) >= 2:
            port, rest = rest[1], rest[2:]
    if device is None or rest:
        io.err(
            "perfquery: only 'perfquery -x -C <ca> [-P <port>]' is simulated in the gpuctl lab\n"
        )
        return 255
    return _ib_out(io, lambda: ib.perfquery(profile, faults, node, device, port))


def _rdma(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    """``rdma statistic show link <dev>/<port>`` (``stat`` too): what validation runs on RoCE
    ports; the lab installs it as /usr/local/bin/rdma, before iproute2's /usr/bin/rdma (which
    finds no RDMA device in a container). Anything else is refused."""
    words = list(args)
    if len(words) == 4 and words[0] in ("statistic", "stat") and words[1:3] == ["show", "link"]:
        device, _, port = words[3].partition("/")
        return _ib_out(io, lambda: ib.rdma_statistic(profile, faults, node, device, port or "1"))
    io.err("rdma: only 'rdma statistic show link <dev>/<port>' is simulated in the gpuctl lab\n")
    return 255


def _ibstat(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    if args in (["-l"], ["--list_of_cas"]):
        io.out(ib.ibstat_list(profile, faults, node))
        return 0
    options = [a for a in args if a.startswith("-")]
    if options:
        io.err(f"ibstat: unrecognized option '{options[0]}'\n")
        io.err("Usage: ibstat [options] <ca_name> [portnum]\n")
        return 255
    if len(args) > 2:
        io.err("Usage: ibstat [options] <ca_name> [portnum]\n")
        return 255
    return _ib_out(io, lambda: ib.ibstat(profile, faults, node, *args))


def _ibv_devinfo(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    device: str | None = None
    verbose = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-d", "--ib-dev") and i + 1 < len(args):
            device, i = args[i + 1], i + 2
            continue
        if arg.startswith("--ib-dev="):
            device = arg.split("=", 1)[1]
        elif arg in ("-v", "-vv", "--verbose"):
            verbose = True
        elif arg in ("-l", "--list"):
            io.out(ib.ibv_devices(profile, faults, node))
            return 0
        elif arg in ("-i", "--ib-port") and i + 1 < len(args):
            i += 1  # one port per HCA here: port 1
        else:
            io.err(f"ibv_devinfo: unrecognized option '{arg}'\nUsage: ibv_devinfo [options]\n")
            return 255
        i += 1
    return _ib_out(io, lambda: ib.ibv_devinfo(profile, faults, node, device, verbose))


def _ibdev2netdev(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    if any(a not in ("-v",) for a in args):
        io.err("Usage: ibdev2netdev [-v] [-h]\n")
        return 1
    io.out(ib.ibdev2netdev(profile, faults, node))
    return 0


# ------------------------------------------------------------------------------------------
# Firmware tools (MFT)


def _mlxfwmanager(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    # query and the update path (-u -i IMAGE -y): gpuctl/lab/sim/mft.py
    run = mft.mlxfwmanager_main(profile, faults, node, args)
    io.out(run.stdout)
    io.err(run.stderr)
    return run.status


def _mlnx_qos(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    # trust and PFC of the RoCE ports: gpuctl/lab/sim/qos.py
    run = qos.mlnx_qos_main(profile, faults, node, args)
    io.out(run.stdout)
    io.err(run.stderr)
    return run.status


def _mlxlink(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    # each port's physical layer: gpuctl/lab/sim/mlxlink.py
    stdout, stderr, status = mlxlink.mlxlink_main(profile, faults, node, args)
    io.out(stdout)
    io.err(stderr)
    return status


def _nvbandwidth(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    # host <-> GPU copies: gpuctl/lab/sim/nvbandwidth.py
    try:
        io.out(nvbandwidth.main(profile, faults, node, args))
    except nvbandwidth.NvbandwidthError as exc:
        io.err(exc.message)
        return exc.status
    return 0


def _lspci(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    # the PCIe tree: gpuctl/lab/sim/pci.py
    status, stdout, stderr = pci.lspci(profile, faults, args)
    io.out(stdout)
    io.err(stderr)
    return status


def _flint(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    if len(args) != 3 or args[0] not in ("-d", "--device") or args[2] not in ("query", "q"):
        io.err("-E- gpuctl lab: only 'flint -d DEVICE query' is simulated\n")
        return 1
    try:
        io.out(mft.flint_query(profile, faults, node, args[1]))
    except mft.MftError as exc:
        io.err(exc.message)
        return exc.status
    return 0


# ------------------------------------------------------------------------------------------
# Benchmarks

_NCCL_OPTS = {
    "-b": "min_bytes",
    "--minbytes": "min_bytes",
    "-e": "max_bytes",
    "--maxbytes": "max_bytes",
    "-f": "factor",
    "--stepfactor": "factor",
    "-g": "gpus",
    "--ngpus": "gpus",
    "-n": "iters",
    "--iters": "iters",
    "-w": "warmup",
    "--warmup_iters": "warmup",
    "-c": "check",
    "--check": "check",
    "-d": "dtype",
    "--datatype": "dtype",
    "-o": "op",
    "--op": "op",
    "-t": "threads",
    "--nthreads": "threads",
}
_NCCL_USAGE = (
    "USAGE: all_reduce_perf \n\t[-t,--nthreads <num threads>] \n\t[-g,--ngpus <gpus per thread>] "
    "\n\t[-b,--minbytes <min size in bytes>] \n\t[-e,--maxbytes <max size in bytes>] "
    "\n\t[-f,--stepfactor <increment factor>] \n\t[-n,--iters <iteration count>] "
    "\n\t[-w,--warmup_iters <warmup iteration count>] \n\t[-c,--check <0/1>] "
    "\n\t[-d,--datatype <nccltype/all>] \n\t[-o,--op <redop/all>] \n\t[-h,--help]\n"
)


def _nccl_tool(collective: str) -> _Handler:
    """The stand-in of ``<collective>_perf`` (nccl-tests: one option parser for every test)."""

    def run(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
        return _nccl_perf(profile, faults, node, args, io, collective)

    return run


def _all_reduce_perf(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    return _nccl_perf(profile, faults, node, args, io, "all_reduce")


def _nccl_perf(
    profile: Profile, faults: Faults, node: str, args: list[str], io: _Out, collective: str
) -> int:
    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        key = _NCCL_OPTS.get(name)
        if key is None or (not eq and i + 1 >= len(args)):
            if arg not in ("-h", "--help"):
                io.err(f"invalid option '{arg}'\n")
            io.out(_NCCL_USAGE.replace("all_reduce_perf", f"{collective}_perf"))
            return 0 if arg in ("-h", "--help") else 1
        if not eq:
            value, i = args[i + 1], i + 1
        i += 1
        try:
            if key in ("min_bytes", "max_bytes"):
                values[key] = perf.parse_size(value)
            elif key in ("dtype", "op"):
                values[key] = value
            else:
                values[key] = int(value)
        except ValueError:
            io.err(f"invalid value {value!r} for {name}\n")
            io.out(_NCCL_USAGE.replace("all_reduce_perf", f"{collective}_perf"))
            return 1
    values.pop("threads", None)  # one thread: every GPU in this process
    if values.get("max_bytes", 1) < values.get("min_bytes", 0):
        values["max_bytes"] = values["min_bytes"]
    if "min_bytes" in values and "max_bytes" not in values:
        values["max_bytes"] = max(values["min_bytes"], 32 << 20)
    if "max_bytes" in values and "min_bytes" not in values:
        values["min_bytes"] = min(values["max_bytes"], 32 << 20)
    task = ranks.job(os.environ)
    if task is not None and collective == "all_reduce":  # srun, 2+ tasks: see lab.sim.ranks
        return _all_reduce_ranks(profile, faults, node, perf.NcclArgs(**values), task, io)
    if task is not None:
        io.err(f"gpuctl-lab-sim: {collective}_perf across nodes is not simulated\n")
        return 1
    try:
        io.out(perf.nccl_perf(profile, faults, node, perf.NcclArgs(**values), collective))
    except perf.ToolFailure as exc:
        io.out(exc.output)
        return exc.status
    nvsmi.nvlink_traffic(faults, node)  # the run loaded the NVLinks
    return perf.nccl_exit_status(faults)


def _all_reduce_ranks(
    profile: Profile, faults: Faults, node: str, args: perf.NcclArgs, task: ranks.Job, io: _Out
) -> int:
    """One srun task of a run across nodes: rank 0 gathers every node's report and prints the
    output; the first task of each other node reports its node; the rest print nothing."""
    hca = os.environ.get("NCCL_IB_HCA") or None  # a rail's run: one adapter
    own = ranks.node_state(profile, faults, node, task.per_node * args.gpus, hca)
    if task.rank == 0:
        states = ranks.gather(task, own)
        try:
            io.out(perf.all_reduce_perf_ranks(args, states, task.per_node))
        except perf.ToolFailure as exc:
            io.out(exc.output)
            return exc.status
        return 1 if any(int(s.get("wrong") or 0) for s in states) else 0
    if task.local == 0 and not ranks.report(task, own):
        io.out(f"{node}: NCCL WARN Bootstrap : no connection to rank 0 on port {task.port}\n")
        return 1
    if own["error"]:
        if task.local == 0:
            io.out(f"{own['error']}\n")
        return 1
    return 0


_PERFTEST_VALUE = {"-d", "--ib-dev", "-s", "--size", "-n", "--iters", "-q", "--qp", "-i",
                   "--ib-port", "-x", "--gid-index", "-D", "--duration", "-p", "--port",
                   "-m", "--mtu", "-t", "--tx-depth", "--tclass"}  # fmt: skip
_PERFTEST_FLAGS = {"--report_gbits", "-a", "--all", "-F", "--CPU-freq", "-R", "--rdma_cm", "-b",
                   "--bidirectional"}  # fmt: skip


_PERFTEST_TITLES = {
    "ib_write_bw": "RDMA_Write BW Test",
    "ib_read_bw": "RDMA_Read BW Test",
    "ib_send_bw": "Send BW Test",
    "ib_write_lat": "RDMA_Write Latency Test",
}


def _perftest(tool: str, cuda: bool = False) -> _Handler:
    """``tool`` as the distribution builds it, or (``cuda``) as software.perftest's build with
    CUDA, whose launchers the lab's perftest source stand-in installs as ``<tool>+cuda``."""

    def handler(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
        return _bw_test(tool, node, args, io, cuda)

    return handler


def _bw_test(tool: str, node: str, args: list[str], io: _Out, cuda: bool = False) -> int:
    """A perftest bandwidth test: server (no host) or client (HOST), see :mod:`.peer`; the
    CUDA options only where perftest is built with CUDA (the distribution's is not: it does
    not know them, as a real one does not)."""
    values: dict[str, Any] = {"title": _PERFTEST_TITLES[tool]}
    server: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if cuda and name == "--use_cuda":
            if not eq:
                if i + 1 >= len(args):
                    io.err(f"{tool}: option '--use_cuda' requires an argument\n")
                    return 1
                value, i = args[i + 1], i + 1
            if not value.isdigit():
                io.err(f" Invalid value {value!r} for --use_cuda\n")
                return 1
            values["cuda"] = int(value)
        elif cuda and arg == "--use_cuda_dmabuf":
            values["dmabuf"] = True
        elif name in _PERFTEST_VALUE:
            if not eq:
                if i + 1 >= len(args):
                    io.err(f" Option {name} requires an argument\n")
                    return 1
                value, i = args[i + 1], i + 1
            try:
                if name in ("-d", "--ib-dev"):
                    values["device"] = value
                elif name in ("-s", "--size"):
                    values["size"] = perf.parse_size(value)
                elif name in ("-n", "--iters"):
                    values["iterations"] = int(value)
                elif name in ("-q", "--qp"):
                    values["qps"] = int(value)
                elif name in ("-p", "--port"):
                    values["port"] = int(value)
                elif name in ("-x", "--gid-index"):
                    values["gid_index"] = int(value)
            except ValueError:
                io.err(f" Invalid value {value!r} for {name}\n")
                return 1
        elif arg in _PERFTEST_FLAGS:
            if arg == "--report_gbits":
                values["gbits"] = True
            elif arg in ("-a", "--all"):
                values["all_sizes"] = True
        elif arg.startswith("-"):
            # getopt_long's message, then perftest's (k8s-netperf PR #263: a build without CUDA)
            io.err(f"{tool}: unrecognized option '{arg}'\n Invalid Command or flag.\n"
                   " Please check command line and run again.\n")  # fmt: skip
            return 1
        else:
            server = arg
        i += 1
    options = perf.PerftestArgs(server=server, **values)

    def banner(text: str) -> None:
        io.out(text)
        io.stdout.flush()

    try:
        if server is None:
            io.out(peer.server(load_state, node, options, banner))
        else:
            io.out(peer.client(load_state, node, options))
    except perf.ToolFailure as exc:
        io.out(exc.stdout)
        io.err(exc.output)
        return exc.status
    return 0


# ------------------------------------------------------------------------------------------
# DCGM, fabric manager, kernel log

_DCGM_LEVELS = {"1": 1, "2": 2, "3": 3, "4": 4, "short": 1, "medium": 2, "long": 3, "xlong": 4}


def _dcgmi(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    if args[:1] != ["diag"]:
        io.err("dcgmi: only 'dcgmi diag -r LEVEL' is simulated in the gpuctl lab\n")
        return 1
    level: int | None = None
    rest = args[1:]
    for i, arg in enumerate(rest):
        if arg in ("-r", "--run") and i + 1 < len(rest):
            level = _DCGM_LEVELS.get(rest[i + 1])
            if rest[i + 1] in dcgm.STRESS_TESTS:  # one test, for test_duration (lab.sim.load)
                test = rest[i + 1]
                load.stress(node, load.stress_params(rest, test) or dcgm.DEFAULT_DURATION_S)
                text, status = dcgm.diag(profile, faults, node, 3, only=test)
                io.out(text)
                return status
    if level is None:
        io.err("Error: Invalid or missing run (-r) argument. Valid levels: 1, 2, 3, 4.\n")
        return 1
    text, status = dcgm.diag(profile, faults, node, level)
    io.out(text)
    return status


def _fabricmanager(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    text = fabric.version_text(profile, faults)
    if text is None:
        io.err("nv-fabricmanager: no NVSwitch in this system\n")
        return 1
    if args in (["--version"], ["-v"]):
        io.out(text)
        return 0
    if faults.get("fabricmanager_failed"):
        io.err("request to query NVSwitch device information from NVSwitch driver failed\n")
        return 1
    return 0


def _persistenced(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    """nvidia-persistenced: its version, or (as the daemon) whether there are GPUs to hold."""
    if args in (["--version"], ["-v"]):  # its own package's version (user space)
        io.out(f"nvidia-persistenced:  version {driver.read(profile).library}\n")
        return 0
    if not visible_gpus(profile, faults, node):
        io.err("nvidia-persistenced: Failed to query NVIDIA devices. Please ensure that the "
               "NVIDIA device files (/dev/nvidia*) exist, and that user 0 has read and write "
               "permissions for those files.\n")  # fmt: skip
        return 1
    return 0


def _hostengine(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    """nv-hostengine (the nvidia-dcgm service): starts when the driver answers."""
    if not visible_gpus(profile, faults, node):
        io.err("nv-hostengine: no GPUs found (the driver reports no devices)\n")
        return 1
    io.out("Started host engine using port number: 5555\n")
    return 0


def _dmesg(profile: Profile, faults: Faults, node: str, args: list[str], io: _Out) -> int:
    iso = "iso" in args or "--time-format=iso" in args
    io.out(kernel.dmesg(profile, faults, node, iso=iso))
    return 0


_Handler = Callable[[Profile, Faults, str, list[str], _Out], int]
_HANDLERS: dict[str, _Handler] = {
    "nvidia-smi": _smi,
    "ibstat": _ibstat,
    "perfquery": _perfquery,
    "ibv_devinfo": _ibv_devinfo,
    "ibdev2netdev": _ibdev2netdev,
    "all_reduce_perf": _all_reduce_perf,
    "all_gather_perf": _nccl_tool("all_gather"),
    "reduce_scatter_perf": _nccl_tool("reduce_scatter"),
    "alltoall_perf": _nccl_tool("alltoall"),
    "sendrecv_perf": _nccl_tool("sendrecv"),
    "ib_write_bw": _perftest("ib_write_bw"),
    "ib_read_bw": _perftest("ib_read_bw"),
    "ib_send_bw": _perftest("ib_send_bw"),
    "ib_write_lat": _perftest("ib_write_lat"),
    "ib_write_bw+cuda": _perftest("ib_write_bw", cuda=True),
    "ib_read_bw+cuda": _perftest("ib_read_bw", cuda=True),
    "ib_send_bw+cuda": _perftest("ib_send_bw", cuda=True),
    "ib_write_lat+cuda": _perftest("ib_write_lat", cuda=True),
    "dcgmi": _dcgmi,
    "nv-fabricmanager": _fabricmanager,
    "nvidia-persistenced": _persistenced,
    "nv-hostengine": _hostengine,
    "dmesg": _dmesg,
    "mlxfwmanager": _mlxfwmanager,
    "flint": _flint,
    "mlxlink": _mlxlink,
    "mlnx_qos": _mlnx_qos,
    "nvbandwidth": _nvbandwidth,
    "lspci": _lspci,
    "rdma": _rdma,
}
