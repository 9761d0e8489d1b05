"""``mlnx_qos`` for a simulated RoCE node: the trust mode and PFC of its Ethernet ports.

What a ConnectX port keeps in its firmware (the priority trust state, PFC per priority) lives
here in the node's simulator state, ``qos.json`` in the state directory (/var/lib/gpuctl-lab-sim,
on the node's disk; see :func:`.mft.state_dir`)::

    {"ens12f0np0": {"trust": "dscp", "pfc": [0, 0, 0, 1, 0, 0, 0, 0]}}

A netdev the file does not name is a fresh port: trust ``pcp``, PFC off on every priority (what
``mlnx_qos -i`` shows before anyone configured it, tests/fixtures/ib/mlnx_qos-i-fresh-port-
trust-pcp-pfc-off.out, and what NVIDIA's doRoCE.sh ``--back_to_def`` returns a port to: trust
pcp, lossy; https://github.com/NVIDIA/doroce-linux, doRoCE.sh@6dc37a78). The ports are the
profile's ``nics.ports`` on an Ethernet (RoCE) link layer; any other interface is not a DCB
device here.

The report copies ``pretty_print()`` of mlnx_qos in mlnx-tools
(https://github.com/Mellanox/mlnx-tools, python/mlnx_qos@8fbfd9cf): "DCBX mode: OS controlled",
"Priority trust state: <trust>", the dscp2prio block only when the trust is dscp, "Receive
buffer size (bytes): ...", "Cable len: 7", "PFC configuration:", ``\\tpriority    0   1 ...``,
``\\tenabled     `` with each bit followed by three blanks, ``\\tbuffer      ...``, then
"tc: N ratelimit: unlimited, tsa: vendor" and ``\\t priority:  N`` per traffic class. The values
are the two real captures in tests/fixtures/ib/mlnx_qos-i-*.out (one ConnectX port with a
524160-byte receive buffer, the default priority-to-TC map 1,0,2,...,7, the dscp2prio map in
the order the kernel's app table lists it). The buffer sizes and the priority-to-buffer line
stay as captured: the simulation does not model receive buffers (on a real port they may move
when PFC changes). Newer mlnx-tools append ``max_buffer_size=N`` to the buffer line where the
kernel reports the total; the capture's tool did not, nor does this one.

Command line, as the real tool's optparse takes it: ``-i/--interface IF`` (required),
``-f/--pfc LIST`` (eight 0/1 values), ``--trust dscp|pcp``, each also as ``--opt=value``. As the
real tool, it sets PFC first, then the trust state, then prints the report (so
``mlnx_qos -i IF --trust dscp`` prints the report after the change). The real tool's other
options (ETS, rate limits, buffers, dscp2prio edits) are refused: they are not simulated.
Standard library only (runs inside lab nodes).
"""

from __future__ import annotations

from collections.abc import Sequence

from .common import Faults, Profile, read_state_file, write_state_file
from .mft import ToolRun, state_dir

STATE_FILE = "qos.json"
DEFAULT_TRUST = "pcp"
DEFAULT_PFC = (0, 0, 0, 0, 0, 0, 0, 0)
TRUST_MODES = ("dscp", "pcp")

# the captured port's values (see the module docstring)
_RECEIVE_BUFFERS = "524160,0,0,0,0,0,0,0,"
_PRIO_BUFFER = (0, 0, 0, 0, 0, 0, 0, 0)
_CABLE_LEN = 7
_PRIO_TC = (1, 0, 2, 3, 4, 5, 6, 7)  # priority -> traffic class

_USAGE = "Usage: mlnx_qos -i <interface> [options]\n"
# optparse: an unknown option goes to stderr with the usage, exit status 2
_NO_SUCH_OPTION = "{usage}\nmlnx_qos: error: no such option: {option}\n"
_NOT_SIMULATED = (
    "mlnx_qos: gpuctl lab: {option} is not simulated (only -i, --pfc and --trust are)\n"
)
# the real tool's options that take a value, besides the simulated ones
_OTHER_VALUE_OPTIONS = {
    "-F", "--specific_pfc", "-P", "--get_pfc", "-p", "--prio_tc", "-s", "--tsa", "-t",
    "--tcbw", "-r", "--ratelimit", "-d", "--dcbx", "--dscp2prio", "--cable_len",
    "--prio2buffer", "--buffer_size",
}  # fmt: skip
_OTHER_FLAGS = {"-a"}
_NAMES = {"-i": "-i", "--interface": "-i", "-f": "--pfc", "--pfc": "--pfc", "--trust": "--trust"}


class QosStateError(Exception):
    """The state file cannot be read (the message names it)."""


def ethernet_ports(profile: Profile) -> list[str]:
    """The netdevs of the profile's RoCE ports (none on an InfiniBand or NIC-less profile)."""
    nics = profile.get("nics") or {}
    if nics.get("link_layer") != "Ethernet":
        return []
    return [str(port["netdev"]) for port in nics.get("ports") or ()]


def read_state(directory: str | None = None) -> dict[str, dict[str, object]]:
    try:
        return read_state_file(directory or state_dir(), STATE_FILE)
    except ValueError as exc:
        raise QosStateError(f"mlnx_qos: gpuctl lab: unreadable QoS state {exc}") from None


def port_state(state: dict[str, dict[str, object]], netdev: str) -> tuple[str, tuple[int, ...]]:
    """(trust, pfc bits) of ``netdev``: the recorded ones, else a fresh port's."""
    entry = state.get(netdev)
    if not isinstance(entry, dict):
        return DEFAULT_TRUST, DEFAULT_PFC
    trust = entry.get("trust")
    pfc = entry.get("pfc")
    if trust not in TRUST_MODES:
        trust = DEFAULT_TRUST
    if not (isinstance(pfc, list) and len(pfc) == 8 and all(b in (0, 1) for b in pfc)):
        pfc = list(DEFAULT_PFC)
    return str(trust), tuple(int(b) for b in pfc)


def save_state(state: dict[str, dict[str, object]], directory: str | None = None) -> None:
    """Write ``state`` atomically (a reader never sees half a file)."""
    write_state_file(directory or state_dir(), STATE_FILE, state)


def report(trust: str, pfc: Sequence[int]) -> str:
    """What ``mlnx_qos -i IF`` prints for a port in this state."""
    lines = ["DCBX mode: OS controlled", f"Priority trust state: {trust}"]
    if trust == "dscp":
        lines.append("dscp2prio mapping:")
        for prio in range(8):
            dscps = "".join(f"{d:02d}," for d in range(prio * 8 + 7, prio * 8 - 1, -1))
            lines.append(f"\tprio:{prio} dscp:{dscps}")
    lines += [
        f"Receive buffer size (bytes): {_RECEIVE_BUFFERS}",
        f"Cable len: {_CABLE_LEN}",
        "PFC configuration:",
        "\tpriority    0   1   2   3   4   5   6   7",
        "\tenabled     " + "".join(f"{bit:1d}   " for bit in pfc),
        "\tbuffer      " + "".join(f"{buf:1d}   " for buf in _PRIO_BUFFER),
    ]
    for tc in range(8):
        lines.append(f"tc: {tc} ratelimit: unlimited, tsa: vendor")
        lines += [f"\t priority:  {up}" for up in range(8) if _PRIO_TC[up] == tc]
    return "\n".join(lines) + "\n"


def _parse(args: Sequence[str]) -> dict[str, str] | ToolRun:
    """The simulated options by their short names, or the real tool's answer to a bad line."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if not eq and name[:2] in ("-i", "-f") and len(name) > 2:  # -iens1f0np0
            name, value, eq = name[:2], name[2:], "="
        if name in _NAMES or name in _OTHER_VALUE_OPTIONS:
            if not eq:
                if i + 1 >= len(args):
                    return ToolRun("", f"{_USAGE}\nmlnx_qos: error: {name} option requires "
                                   "an argument\n", 2)  # fmt: skip
                value, i = args[i + 1], i + 1
            if name not in _NAMES:
                return ToolRun("", _NOT_SIMULATED.format(option=name), 1)
            opts[_NAMES[name]] = value
        elif name in _OTHER_FLAGS:
            return ToolRun("", _NOT_SIMULATED.format(option=name), 1)
        elif arg.startswith("-") and arg != "-":
            return ToolRun("", _NO_SUCH_OPTION.format(usage=_USAGE, option=name), 2)
        else:
            return ToolRun(f"Bad arguments\n{_USAGE}", "", 1)
        i += 1
    return opts


def _pfc_bits(text: str) -> tuple[int, ...] | ToolRun:
    """``--pfc`` as the real tool checks it: each item 0 or 1, exactly eight."""
    bits: list[int] = []
    for item in text.split(","):
        if len(bits) >= 8:
            return ToolRun("Too many items for PFC\n", "", 1)
        try:
            value = int(item)
            if value < 0 or value > 1:
                raise ValueError(f"{value} is not in the range 0..1")
        except ValueError as exc:
            return ToolRun(f"Bad value for PFC: {exc}\n{_USAGE}", "", 1)
        bits.append(value)
    if len(bits) != 8:
        return ToolRun("pfc list must have 8 items\n", "", 1)
    return tuple(bits)


def mlnx_qos_main(profile: Profile, faults: Faults, node: str, args: Sequence[str]) -> ToolRun:
    """The simulated ``mlnx_qos`` command line (see the module docstring)."""
    opts = _parse(args)
    if isinstance(opts, ToolRun):
        return opts
    netdev = opts.get("-i")
    if netdev is None:
        return ToolRun(f"Interface name is required\n{_USAGE}", "", 1)
    if netdev not in ethernet_ports(profile):
        # the real tool dies in its first netlink request with a traceback ending so
        # (python/Python/netlink.py: OSError("Netlink error: %s (%d)" % (strerror, errno)))
        return ToolRun("", "OSError: Netlink error: No such device (19)\n", 1)
    try:
        state = read_state()
    except QosStateError as exc:
        return ToolRun("", f"{exc}\n", 1)
    trust, pfc = port_state(state, netdev)
    if "--pfc" in opts:
        bits = _pfc_bits(opts["--pfc"])
        if isinstance(bits, ToolRun):
            return bits
        pfc = bits
        state[netdev] = {"trust": trust, "pfc": list(pfc)}
        save_state(state)
    if "--trust" in opts:
        if opts["--trust"] not in TRUST_MODES:
            return ToolRun("Invalid trust state command. Refer to the help.\n", "", 1)
        trust = opts["--trust"]
        state[netdev] = {"trust": trust, "pfc": list(pfc)}
        save_state(state)
    return ToolRun(report(trust, pfc), "", 0)
