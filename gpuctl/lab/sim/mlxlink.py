"""``mlxlink -d <hca> [-p 1] -m -c`` (NVIDIA MFT) for a simulated node: each adapter port's
operational state, mlxlink's troubleshooting verdict, the transceiver (Module Info) and the
physical counters and bit error rates. Standard library only.

The layout is the real tool's (MFT 4.30, column of 35 characters, sections underlined with
dashes) as in the full captures tests/fixtures/ib/mlxlink-m-c-bluefield3-*.txt and
tests/fixtures/ib/counters/mlxlink-c-bluefield3-*.txt; an InfiniBand port adds the ``Symbol
Errors`` and ``Symbol BER`` lines and prints the speed as ``IB-NDR`` with its FEC as in the
ConnectX-6 HDR capture (tests/fixtures/ib/counters/mlxlink-show-*-cx6-hdr-*); the Module Info
readings and their alarm thresholds are those of the OSFP capture
tests/fixtures/ib/mlxlink-module-info-osfp-excerpt.txt. A healthy port shows no error since
the counters were cleared (BER ``15E-255``, what mlxlink prints for none); the ``ib_ber``
fault gives one HCA the BER it names after every correction (Symbol and Effective BER), a
thousand times that before FEC, and error counts to match.
"""

from __future__ import annotations

from .common import Faults, Profile
from .mft import MftError, running_hcas

NONE = "15E-255"  # mlxlink's BER when no error was counted
MFT_VERSION = "mft 4.26.1-3"  # the lab repository's MFT stand-in (repo_packages.yml)
_IB_SPEEDS = {100: "EDR", 200: "HDR", 400: "NDR", 800: "XDR"}
# PTYS masks as mlxlink prints them (ConnectX-6 HDR capture: 0x75 = HDR,EDR,FDR,QDR,SDR)
_IB_BITS = (("XDR", 0x100), ("NDR", 0x80), ("HDR", 0x40), ("EDR", 0x20), ("FDR", 0x10))
_IB_BITS_LOW = (("FDR10", 0x8), ("QDR", 0x4), ("DDR", 0x2), ("SDR", 0x1))
_IDENTIFIERS = {100: "QSFP28", 200: "QSFP56", 400: "OSFP", 800: "OSFP"}


def _line(key: str, value: object) -> str:
    return f"{key:<35}: {value}"


def _section(title: str, rows: list[tuple[str, object]]) -> list[str]:
    return [title, "-" * len(title), *(_line(k, v) for k, v in rows), ""]


def _mask(names: list[str]) -> str:
    bits = dict((*_IB_BITS, *_IB_BITS_LOW))
    value = sum(bits[n] for n in names)
    return f"0x{value:08x} ({','.join(names)})"


def _ib_speeds(top: str, cable: bool) -> list[str]:
    order = [n for n, _ in _IB_BITS]
    names = order[order.index(top) :]
    low = ["FDR10", "QDR", "DDR", "SDR"] if cable else ["QDR", "SDR"]
    return names + low


def _uptime_minutes() -> float:
    try:
        with open("/proc/uptime", encoding="ascii") as handle:
            return round(float(handle.read().split()[0]) / 60, 1)
    except (OSError, ValueError, IndexError):
        return 0.0


def mlxlink(profile: Profile, faults: Faults, node: str, device: str) -> str:
    """What ``mlxlink -d DEVICE -m -c`` prints for one HCA of the node."""
    found = {h.name: h for h in running_hcas(profile, faults, node)}
    hca = found.get(device)
    if hca is None:
        raise MftError(f"-E- Failed to open the device: {device}\n", 1)
    ib = hca.link_layer == "InfiniBand"
    up = hca.state == "Active"
    lanes = 4
    width = max(1, lanes * hca.rate // hca.max_rate) if up else lanes
    top = _IB_SPEEDS.get(hca.max_rate, "NDR")
    speed = f"IB-{_IB_SPEEDS.get(hca.rate, top)}" if ib else f"{hca.rate}G"
    fec = "RS-FEC - (544,514) + PLR" if ib else "Standard RS-FEC - RS(544,514)"
    lines = _section(
        "Operational Info",
        [
            ("State", "Active" if up else "Disable"),
            ("Physical state", hca.physical_state if up else "Disabled"),
            ("Speed", speed if up else "N/A"),
            ("Width", f"{width}x" if up else "N/A"),
            ("FEC", fec if up else "N/A"),
            ("Loopback Mode", "No Loopback"),
            ("Auto Negotiation", "ON"),
        ],
    )
    if ib:
        lines += _section(
            "Supported Info",
            [
                ("Enabled Link Speed", _mask(_ib_speeds(top, cable=False))),
                ("Supported Cable Speed", _mask(_ib_speeds(top, cable=True))),
            ],
        )
    lines += _section(
        "Troubleshooting Info",
        [
            ("Status Opcode", 0),
            ("Group Opcode", "N/A"),
            ("Recommendation", "No issue was observed"),
        ],
    )
    lines += _section(
        "Tool Information",
        [
            ("Firmware Version", hca.firmware),
            ("amBER Version", "2.13"),
            ("MFT Version", MFT_VERSION),
        ],
    )
    lines += _section(
        "Module Info",
        [
            ("Temperature [C]", "54 [-5..75]"),
            ("Voltage [mV]", "3261.2 [2970..3630]"),
            ("Bias Current [mA]", "8.380,8.380,8.380,8.380 [2..15]"),
            ("Rx Power Current [dBm]", "1.886,1.989,2.281,1.976 [-10.41..6]"),
            ("Tx Power Current [dBm]", "1.562,1.427,1.559,1.761 [-8.508..5]"),
            ("Identifier", _IDENTIFIERS.get(hca.max_rate, "OSFP")),
        ],
    )
    bad: str | None = (faults.get("ib_ber") or {}).get(hca.name)
    corrected = bad or NONE
    raw = NONE if bad is None else f"{float(bad) * 1000:.0E}".replace("E-0", "E-")
    errors = 0 if bad is None else 1 + int(float(bad) * 1e12)
    counters: list[tuple[str, object]] = [("Time Since Last Clear [Min]", _uptime_minutes())]
    if ib:
        counters += [("Symbol Errors", errors), ("Symbol BER", corrected)]
    counters += [
        ("Effective Physical Errors", errors),
        ("Effective Physical BER", corrected),
        ("Raw Physical Errors Per Lane", ",".join([str(errors * 1000)] * lanes)),
        ("Link Down Counter", 0),
        ("Link Error Recovery Counter", 0),
        ("Raw Physical BER", raw),
    ]
    lines += _section("Physical Counters and BER Info", counters)
    return "\n".join(lines)


def mlxlink_main(
    profile: Profile, faults: Faults, node: str, args: list[str]
) -> tuple[str, str, int]:
    """(stdout, stderr, status) of ``mlxlink ARGS``: ``-d DEVICE [-p 1] -m -c`` only."""
    rest = list(args)
    device = None
    if rest[:1] in (["-d"], ["--device"]) and len(rest) >= 2:
        device, rest = rest[1], rest[2:]
    if rest[:2] in (["-p", "1"], ["--port", "1"]):
        rest = rest[2:]
    if device is None or sorted(rest) != ["-c", "-m"]:
        return "", "-E- gpuctl lab: only 'mlxlink -d DEVICE [-p 1] -m -c' is simulated\n", 1
    try:
        return mlxlink(profile, faults, node, device), "", 0
    except MftError as exc:
        return "", exc.message, exc.status
