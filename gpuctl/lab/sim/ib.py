"""InfiniBand/RoCE tool outputs for a simulated node: ``ibstat``, ``ibv_devinfo``, ``ibdev2netdev``.
Layouts are copied from real captures in tests/fixtures/ib. Standard library only.

The firmware version ``ibstat`` and ``ibv_devinfo`` print is the one running now, from the same
state as ``mlxfwmanager`` (gpuctl/lab/sim/mft.py): a burned image once the node has rebooted.
"""

from __future__ import annotations

from .common import Faults, Hca, Profile, hcas, read_state_file, write_state_file
from .mft import running_hcas, state_dir

_SPEED = {  # per-lane speed ibv_devinfo prints for a 4X link of this rate
    800: "200.0 Gbps (256)",
    400: "100.0 Gbps (128)",
    200: "50.0 Gbps (64)",
    100: "25.0 Gbps (32)",
    56: "14.0 Gbps (16)",
    40: "10.0 Gbps (8)",
    10: "2.5 Gbps (1)",
}


def _cap_mask(hca: Hca) -> str:
    return "0x00010000" if hca.link_layer == "Ethernet" else "0xa751e848"


def _ibstat_ca(hca: Hca, port: str | None = None) -> list[str]:
    ethernet = hca.link_layer == "Ethernet"
    port_lines = [
        "        Port 1:",
        f"                State: {hca.state}",
        f"                Physical state: {hca.physical_state}",
        f"                Rate: {hca.rate}",
        f"                Base lid: {0 if ethernet or not hca.active else hca.lid}",
        "                LMC: 0",
        f"                SM lid: {0 if ethernet or not hca.active else 1}",
        f"                Capability mask: {_cap_mask(hca)}",
        f"                Port GUID: {hca.port_guid}",
        f"                Link layer: {hca.link_layer}",
    ]
    if port is not None:  # `ibstat mlx5_0 1`: the port block alone, one level less indented
        return [line[8:] for line in port_lines[1:]]
    return [
        f"CA '{hca.name}'",
        f"        CA type: {hca.ca_type}",
        "        Number of ports: 1",
        f"        Firmware version: {hca.firmware}",
        "        Hardware version: 0",
        f"        Node GUID: {hca.node_guid}",
        f"        System image GUID: {hca.node_guid}",
        *port_lines,
    ]


class IbError(Exception):
    """What the real tool would print on stderr, and its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def ibstat(
    profile: Profile, faults: Faults, node: str, ca: str | None = None, port: str | None = None
) -> str:
    devices = running_hcas(profile, faults, node)
    if ca is not None:
        devices = [d for d in devices if d.name == ca]
        if not devices:
            raise IbError(
                f"ibpanic: [{4000 + len(ca)}] main: stat of IB device '{ca}' failed: "
                "No such file or directory\n",
                255,
            )
        if port is not None and port != "1":
            raise IbError(f"ibpanic: [4001] main: {ca}: port {port} not found\n", 255)
    lines: list[str] = []
    for hca in devices:
        lines += _ibstat_ca(hca, port)
    return "\n".join(lines) + "\n" if lines else ""


def ibstat_list(profile: Profile, faults: Faults, node: str) -> str:
    return "".join(f"{hca.name}\n" for hca in hcas(profile, faults, node))


def _colon_guid(guid: str) -> str:
    digits = guid.removeprefix("0x").rjust(16, "0")
    return ":".join(digits[i : i + 4] for i in range(0, 16, 4))


def ibv_devinfo(
    profile: Profile, faults: Faults, node: str, device: str | None = None, verbose: bool = False
) -> str:
    devices = running_hcas(profile, faults, node)
    if not devices:
        raise IbError("No IB devices found\n", 255)
    if device is not None:
        devices = [d for d in devices if d.name == device]
        if not devices:
            raise IbError(f"IB device '{device}' wasn't found\n", 255)
    nics = profile["nics"]
    blocks = []
    for hca in devices:
        ethernet = hca.link_layer == "Ethernet"
        state = "PORT_ACTIVE (4)" if hca.active else "PORT_DOWN (1)"
        lines = [
            f"hca_id:\t{hca.name}",
            "\ttransport:\t\t\tInfiniBand (0)",
            f"\tfw_ver:\t\t\t\t{hca.firmware}",
            f"\tnode_guid:\t\t\t{_colon_guid(hca.node_guid)}",
            f"\tsys_image_guid:\t\t\t{_colon_guid(hca.node_guid)}",
            "\tvendor_id:\t\t\t0x02c9",
            f"\tvendor_part_id:\t\t\t{nics['vendor_part_id']}",
            "\thw_ver:\t\t\t\t0x0",
            f"\tboard_id:\t\t\t{nics['board_id']}",
            "\tphys_port_cnt:\t\t\t1",
            "\t\tport:\t1",
            f"\t\t\tstate:\t\t\t{state}",
            "\t\t\tmax_mtu:\t\t4096 (5)",
            f"\t\t\tactive_mtu:\t\t{'1024 (3)' if ethernet else '4096 (5)'}",
            f"\t\t\tsm_lid:\t\t\t{0 if ethernet or not hca.active else 1}",
            f"\t\t\tport_lid:\t\t{0 if ethernet or not hca.active else hca.lid}",
            "\t\t\tport_lmc:\t\t0x00",
            f"\t\t\tlink_layer:\t\t{hca.link_layer}",
        ]
        if verbose:
            lines += [
                "\t\t\tmax_msg_sz:\t\t0x40000000",
                f"\t\t\tport_cap_flags:\t\t{_cap_mask(hca)}",
                "\t\t\tactive_width:\t\t4X (2)",
                f"\t\t\tactive_speed:\t\t{_SPEED.get(hca.rate, '2.5 Gbps (1)')}",
                f"\t\t\tphys_state:\t\t{_phys_state(hca)}",
            ]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def _phys_state(hca: Hca) -> str:
    return {"LinkUp": "LINK_UP (5)", "Disabled": "DISABLED (3)"}.get(
        hca.physical_state, "POLLING (2)"
    )


def ibv_devices(profile: Profile, faults: Faults, node: str) -> str:
    """``ibv_devinfo -l``."""
    devices = hcas(profile, faults, node)
    return f"{len(devices)} HCA{'s' if len(devices) != 1 else ''} found:\n" + "".join(
        f"\t{hca.name}\n" for hca in devices
    )


def ibdev2netdev(profile: Profile, faults: Faults, node: str) -> str:
    return "".join(
        f"{hca.name} port 1 ==> {hca.netdev} ({'Up' if hca.active else 'Down'})\n"
        for hca in hcas(profile, faults, node)
    )


# ------------------------------------------------------------------------------------------
# perfquery -x -C <hca> -P 1: a port's extended counters, in the layout of the real -x capture
# (tests/fixtures/ib/counters/perfquery-x-*.txt). The counts live in the node's state dir
# (ib-counters.json, node -> HCA -> counter -> count): under the `ib_link_flaps` fault every
# ib_write_bw run over that HCA adds to its error counters.

IB_COUNTERS_FILE = "ib-counters.json"
_DATA = (
    "PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts",
    "PortUnicastXmitPkts", "PortUnicastRcvPkts", "PortMulticastXmitPkts", "PortMulticastRcvPkts",
)  # fmt: skip
_ERRORS = (
    "SymbolErrorCounter", "LinkErrorRecoveryCounter", "LinkDownedCounter", "PortRcvErrors",
    "PortRcvRemotePhysicalErrors", "PortRcvSwitchRelayErrors", "PortXmitDiscards",
    "PortXmitConstraintErrors", "PortRcvConstraintErrors", "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors", "VL15Dropped",
)  # fmt: skip


def _field(name: str, value: object) -> str:
    return f"{name}:".ljust(33, ".") + f"{value}"


def perfquery(profile: Profile, faults: Faults, node: str, device: str, port: str) -> str:
    """The output of ``perfquery -x -C device -P port`` (raises IbError as the tool fails)."""
    hca = next((h for h in hcas(profile, faults, node) if h.name == device), None)
    if hca is None or hca.link_layer == "Ethernet" or port != "1":
        raise IbError(
            f"ibwarn: [1] mad_rpc_open_port: can't open UMAD port ({device}:{port})\n"
            f"perfquery: iberror: failed: Failed to open '{device}' port '{port}'\n",
            255,
        )
    counts = (read_state_file(state_dir(), IB_COUNTERS_FILE).get(node) or {}).get(device) or {}
    lines = [
        f"# Port extended counters: Lid {hca.lid} port {port} "
        "(CapMask: 0x5300 CapMask2: 0x0000002)",
        _field("PortSelect", port),
        _field("CounterSelect", "0x0000"),
        *(_field(name, int(counts.get(name, 0))) for name in _DATA),
        _field("CounterSelect2", "0x00000000"),
        *(_field(name, int(counts.get(name, 0))) for name in _ERRORS),
        _field("PortXmitWait", int(counts.get("PortXmitWait", 0))),
        _field("QP1Dropped", 0),
    ]
    return "\n".join(lines) + "\n"


def port_traffic(faults: Faults, node: str, device: str) -> None:
    """One ib_write_bw run over ``device``: under `ib_link_flaps` on it, COUNT link-downs,
    COUNT link error recoveries and ten symbol errors per flap; under `roce_errors` COUNT more
    of its counter; without either nothing is written (the data counters stay 0: nothing
    judges them)."""
    flaps = (faults.get("ib_link_flaps") or {}).get(device)
    roce = (faults.get("roce_errors") or {}).get(device)
    if not flaps and not roce:
        return
    directory = state_dir()
    counts = read_state_file(directory, IB_COUNTERS_FILE)
    mine = counts.setdefault(node, {}).setdefault(device, {})
    grow: dict[str, int] = {}
    if flaps:
        grow = {"LinkDownedCounter": flaps, "LinkErrorRecoveryCounter": flaps}
        grow["SymbolErrorCounter"] = 10 * flaps
    if roce:  # a RoCE port's hw counter (roce_errors: {counter: count})
        grow |= {str(k): int(v) for k, v in roce.items()}
    for name, value in grow.items():
        mine[name] = int(mine.get(name, 0)) + int(value)
    write_state_file(directory, IB_COUNTERS_FILE, counts)


# ------------------------------------------------------------------------------------------
# rdma statistic show link <dev>/<port>: a RoCE port's hw counters (iproute2), in the layout and
# with the counter set of a real mlx5 RoCE port (tests/fixtures/ib/counters/rdma-statistic-*):
# the kernel's names, traffic, error and congestion counters on one line. Counts live in the
# same state file as perfquery's: under the `roce_errors` fault every ib_write_bw run over that
# adapter adds to the named counter.

HW_COUNTERS = (
    "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "out_of_buffer",
    "out_of_sequence", "duplicate_request", "rnr_nak_retry_err", "packet_seq_err",
    "implied_nak_seq_err", "local_ack_timeout_err", "rx_dct_connect", "resp_local_length_error",
    "resp_cqe_error", "req_cqe_error", "req_remote_invalid_request", "req_remote_access_errors",
    "resp_remote_access_errors", "resp_cqe_flush_error", "req_cqe_flush_error",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans", "rp_cnp_ignored", "rp_cnp_handled",
    "np_ecn_marked_roce_packets", "np_cnp_sent", "rx_icrc_encapsulated",
)  # fmt: skip


def rdma_statistic(profile: Profile, faults: Faults, node: str, device: str, port: str) -> str:
    """The output of ``rdma statistic show link device/port`` (raises IbError as the tool
    fails): the RoCE ports' hw counters; InfiniBand ports are read with perfquery here."""
    hca = next((h for h in hcas(profile, faults, node) if h.name == device), None)
    if hca is None or port != "1":
        raise IbError("Wrong device name\n", 255)
    if hca.link_layer != "Ethernet":
        raise IbError("rdma: the gpuctl lab simulates the counters of RoCE ports only\n", 255)
    counts = (read_state_file(state_dir(), IB_COUNTERS_FILE).get(node) or {}).get(device) or {}
    pairs = " ".join(f"{name} {int(counts.get(name, 0))}" for name in HW_COUNTERS)
    return f"link {device}/{port} {pairs} \n"  # a blank at the end, as iproute2 prints
