"""InfiniBand tools: ``ibstat``, ``ibstatus``, ``ibv_devinfo``, ``ibdev2netdev`` (``mlxlink``:
:mod:`gpuctl.validation.parsers.mlxlink`).

What real outputs look like, and how this module copes (contract: docs/parse.md):

- ``ibstat``: ``CA '<name>'`` blocks, CA fields indented once and ``Port <n>:`` blocks indented
  twice. Indentation is tabs in the tool's output but spaces in many pastes (and in some test
  data), so lines are stripped and fields are told apart by their labels, not by indentation.
  When a CA cannot be opened ibstat prints what it has and then ``ibpanic: ... stat of IB device
  'mlx5_8' failed`` (exit 255): the listing is incomplete, which is a problem, not a failure to
  recognise. ``ibwarn:`` lines (debug output) are kept as warnings.
- ``ibstatus``: one ``Infiniband device '<name>' port <n> status:`` block per port; ``state`` and
  ``phys state`` carry a numeric code (``4: ACTIVE``), ``rate`` a text (``200 Gb/sec (4X HDR)``),
  the lids are hexadecimal, ``default gid`` is ``unknown`` on ports without one (Ethernet VFs).
  Older versions print no ``link_layer`` line.
- ``ibv_devinfo`` (rdma-core and MLNX_OFED; plain, ``-v`` and ``-vv``): ``hca_id:`` blocks, an
  optional ``Device ports:`` line (MLNX_OFED), ``port:`` blocks. ``-v`` adds many device lines
  (flag lists, ``key = value``, lines without a colon) which are skipped, and per-port lines of
  which ``phys_state``, ``active_width``, ``active_speed`` and the ``GID[..]`` table are kept.
  ``-i <port>`` shows fewer ports than ``phys_port_cnt``: named in problems.
- ``ibdev2netdev``: ``mlx5_0 port 1 ==> ib0 (Up)``; ``-v`` prefixes the PCI address, the HCA type
  and part number, the board description (which may itself hold parentheses and long padding),
  the firmware and the port state: ``... fw 20.28.1002 port 1 (ACTIVE) ==> ib0 (Up)``. Anything
  in parentheses after the link state is kept as ``extra``. Pastes piped through ``column -t``
  have runs of blanks: all separators are ``\\s+``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import number, to_int
from gpuctl.validation.parsing import LineProblems, ParseResult, clean, parser, unrecognised

IBSTAT = "ibstat"
IBSTATUS = "ibstatus"
IBV_DEVINFO = "ibv-devinfo"
IBDEV2NETDEV = "ibdev2netdev"

PLACEHOLDERS = frozenset(
    {"", "N/A", "n/a", "NA", "[N/A]", "[Not Supported]", "Unknown Error", "ERR!"}
)

# ------------------------------------------------------------------------------------------
# Shared helpers


def split_kv(line: str) -> tuple[str, str] | None:
    """``Label: value`` -> (label, value) split at the first colon; None without a label."""
    label, colon, value = line.partition(":")
    label = label.strip()
    if not colon or not label:
        return None
    return label, value.strip()


def _text(value: str) -> str | None:
    """A text value as printed; placeholders (``N/A``, empty) are None."""
    value = value.strip()
    return None if value in PLACEHOLDERS else value


# Listings repeat the same short values (port counts, lids): their reading is remembered
_SHORT = 40


@functools.lru_cache(maxsize=4096)
def _short_int(value: str) -> int | None:
    return to_int(value, hex_prefix=True)


def _int(value: str | None) -> int | None:
    """A decimal or ``0x`` hexadecimal integer; anything else (a sign, 5,000 digits) is None."""
    if value is None or value.strip()[:1] in ("-", "+"):
        return None
    return _short_int(value) if len(value) <= _SHORT else to_int(value, hex_prefix=True)


def _name_code(value: str) -> tuple[str | None, int | None]:
    """``PORT_ACTIVE (4)`` -> ("PORT_ACTIVE", 4); a value without a code keeps code None."""
    m = re.fullmatch(r"(?P<name>.*?)\s*\((?P<code>\d+)\)", value.strip())
    if m is None:
        return _text(value), None
    return _text(m["name"]), to_int(m["code"])


def _missing(block: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    return [k for k in keys if block.get(k) is None]


def snake_key(label: str) -> str:
    """``Temperature [C]`` -> ``temperature_c``; ``Attenuation (5g,7g,12g)[dB]`` ->
    ``attenuation_5g_7g_12g_db``."""
    return re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")


# ------------------------------------------------------------------------------------------
# ibstat

# label (lower case) -> (key, converter)
_Conv = Callable[[str], Any]
_IBSTAT_CA: dict[str, tuple[str, _Conv]] = {
    "ca type": ("ca_type", _text),
    "number of ports": ("number_of_ports", _int),
    "firmware version": ("firmware_version", _text),
    "hardware version": ("hardware_version", _text),
    "node guid": ("node_guid", _text),
    "system image guid": ("system_image_guid", _text),
}
_IBSTAT_PORT: dict[str, tuple[str, _Conv]] = {
    "state": ("state", _text),
    "physical state": ("physical_state", _text),
    "rate": ("rate", number),
    "base lid": ("base_lid", _int),
    "lmc": ("lmc", _int),
    "sm lid": ("sm_lid", _int),
    "capability mask": ("capability_mask", _text),
    "port guid": ("port_guid", _text),
    "link layer": ("link_layer", _text),
}
_IBSTAT_CA_KEYS = tuple(k for k, _ in _IBSTAT_CA.values())
_IBSTAT_PORT_KEYS = tuple(k for k, _ in _IBSTAT_PORT.values())
_IB_DIAG_MSG = re.compile(r"(?P<tag>ibpanic|iberror|ibwarn|ibstat)\s*:\s*(?P<msg>.*)")
_IBSTAT_CA_HEADER = re.compile(r"CA\s+'(?P<name>[^']*)'")
_IBSTAT_PORT_HEADER = re.compile(r"Port\s+(?P<n>\d+)\s*:")


def _new_adapter(keys: tuple[str, ...]) -> dict[str, Any]:
    """An ibstat CA or ibv_devinfo HCA before its lines are read: every key None, no ports."""
    adapter: dict[str, Any] = dict.fromkeys(keys)
    adapter["ports"] = {}
    return adapter


@parser(
    IBSTAT,
    description="ibstat: InfiniBand CAs, firmware, GUIDs and per-port state, rate, lids",
)
def parse_ibstat(text: str) -> ParseResult:
    problems = LineProblems(ignored=True)
    cas: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    warnings: list[str] = []
    ca_name: str | None = None
    port: dict[str, Any] | None = None
    port_name = ""

    for raw in clean(text).split("\n"):
        line = raw.strip()
        if not line:
            continue
        # every tag of _IB_DIAG_MSG starts with "ib" (a faster test first)
        diag = _IB_DIAG_MSG.fullmatch(line) if line.startswith("ib") else None
        if diag is not None:
            if diag["tag"] == "ibwarn":
                warnings.append(line)
            else:
                errors.append(line)
                problems.add(f"ibstat failed, the listing is incomplete: {line}")
            continue
        m = _IBSTAT_CA_HEADER.fullmatch(line) if line.startswith("CA") else None
        if m is not None:
            ca_name, port = m["name"], None
            if not ca_name:
                problems.add("CA header with an empty name")
            if ca_name in cas:
                problems.add(f"CA {ca_name!r} listed twice; the last block is kept")
            cas[ca_name] = _new_adapter(_IBSTAT_CA_KEYS)
            continue
        m = _IBSTAT_PORT_HEADER.fullmatch(line) if line.startswith("Port") else None
        if m is not None:
            if ca_name is None:
                problems.line("before the first CA header", line)
                continue
            port_name = m["n"]
            ports = cas[ca_name]["ports"]
            if port_name in ports:
                problems.add(f"CA {ca_name!r} port {port_name} listed twice; the last is kept")
            port = ports[port_name] = dict.fromkeys(_IBSTAT_PORT_KEYS)
            continue
        kv = split_kv(line)
        label = kv[0].lower() if kv else ""
        in_port = label in _IBSTAT_PORT
        if kv is None or ca_name is None or (not in_port and label not in _IBSTAT_CA):
            problems.line("ibstat" if ca_name is None else f"CA {ca_name!r}", line)
            continue
        if in_port:
            if port is None:
                problems.line(f"CA {ca_name!r} (port field before any 'Port N:')", line)
                continue
            target = port
            key, conv = _IBSTAT_PORT[label]
        else:
            target = cas[ca_name]
            key, conv = _IBSTAT_CA[label]
        value = conv(kv[1])
        if value is None or target[key] is not None:
            where = f"CA {ca_name!r} port {port_name}" if in_port else f"CA {ca_name!r}"
            if value is None:
                problems.add(f"{where}: {kv[0]} has no usable value: {kv[1]!r}")
            if target[key] is not None:
                problems.add(f"{where}: {kv[0]} printed twice; the last is kept")
        target[key] = value

    if not cas:
        reason = "no CA '<name>' block found"
        if errors:
            reason = f"ibstat printed no CA, only: {errors[0]}"
        return unrecognised(IBSTAT, reason, errors=errors)

    for name, ca in cas.items():
        missing = _missing(ca, _IBSTAT_CA_KEYS)
        if missing:
            problems.add(f"CA {name!r}: missing or unreadable {', '.join(missing)}")
        count, ports = ca["number_of_ports"], ca["ports"]
        if not ports:
            problems.add(f"CA {name!r}: no 'Port N:' block")
        elif isinstance(count, int) and count != len(ports):
            problems.add(f"CA {name!r}: {len(ports)} port block(s), Number of ports {count}")
        for pname, p in ports.items():
            missing = _missing(p, _IBSTAT_PORT_KEYS)
            if missing:
                problems.add(
                    f"CA {name!r} port {pname}: missing or unreadable {', '.join(missing)}"
                )

    data = {"cas": cas, "errors": errors, "warnings": warnings}
    return ParseResult(IBSTAT, True, data, problems.result())


@dataclass(frozen=True, slots=True)
class IbstatPort:
    """What a judge reads of one ``Port <n>:`` block; a field not shown (or ``N/A``) is None."""

    state: str | None  # "Active", "Down", ...
    physical_state: str | None  # "LinkUp", "Disabled", "Polling", ...
    rate: int | float | None  # Gb/s as printed: finite (numbers.number), maybe below zero
    link_layer: str | None  # "InfiniBand" | "Ethernet"
    port_guid: str | None  # as printed ("0x...")


@dataclass(frozen=True, slots=True)
class IbstatCa:
    """One ``CA '<name>'`` block (a CA printed twice: its last block)."""

    node_guid: str | None
    ports: Mapping[str, IbstatPort]  # the port number as printed ("1") -> port
    ca_type: str | None = None  # "MT4129" (ConnectX-7)
    firmware_version: str | None = None  # "28.39.1002"

    def port(self, number: str) -> IbstatPort | None:
        return self.ports.get(number)


@dataclass(frozen=True, slots=True)
class Ibstat:
    """What ``ibstat`` listed: CA name -> CA, in output order, and the ibpanic/iberror lines
    (the listing is incomplete)."""

    cas: Mapping[str, IbstatCa]
    errors: tuple[str, ...]


def ibstat_of(data: Mapping[str, Any]) -> Ibstat:
    """The record of a recognised ``ibstat`` parse (its ``data``, docs/parse.md)."""
    cas = {
        name: IbstatCa(
            node_guid=ca["node_guid"],
            ports={
                number: IbstatPort(
                    port["state"],
                    port["physical_state"],
                    port["rate"],
                    port["link_layer"],
                    port["port_guid"],
                )
                for number, port in ca["ports"].items()
            },
            ca_type=ca.get("ca_type"),
            firmware_version=ca.get("firmware_version"),
        )
        for name, ca in data["cas"].items()
    }
    return Ibstat(cas=cas, errors=tuple(data["errors"]))


# ------------------------------------------------------------------------------------------
# ibstatus

_IBSTATUS_HEADER = re.compile(
    r"Infiniband device\s+'(?P<name>[^']*)'\s+port\s+(?P<port>\d+)\s+status\s*:", re.IGNORECASE
)
_IBSTATUS_KEYS = (
    "default_gid",
    "base_lid",
    "sm_lid",
    "state",
    "state_code",
    "physical_state",
    "physical_state_code",
    "rate",
    "rate_text",
    "link_layer",
)
# Labels printed by every ibstatus version (link_layer came later, so it is optional).
_IBSTATUS_REQUIRED_LABELS = ("default gid", "base lid", "sm lid", "state", "phys state", "rate")
_IBSTATUS_LABELS = frozenset({*_IBSTATUS_REQUIRED_LABELS, "link layer"})
_CODE_NAME = re.compile(r"(?P<code>\d+)\s*:\s*(?P<name>.+)")
_RATE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*Gb/sec\b.*")


def _ibstatus_field(port: dict[str, Any], label: str, value: str) -> str | None:
    """Store one field; returns a problem text or None."""
    value = value.strip()
    if label == "default gid":
        port["default_gid"] = None if value.lower() == "unknown" else _text(value)
        return None if value else "empty default gid"
    if label in ("base lid", "sm lid"):
        key = label.replace(" ", "_")
        port[key] = _int(value)
        return None if port[key] is not None else f"{label} is not a number: {value!r}"
    if label in ("state", "phys state"):
        key = "state" if label == "state" else "physical_state"
        m = _CODE_NAME.fullmatch(value)
        port[key] = m["name"].strip() if m else _text(value)
        port[f"{key}_code"] = to_int(m["code"]) if m else None
        if port[f"{key}_code"] is None:
            return f"{label} without its numeric code: {value[:80]!r}"
        return None
    if label == "rate":
        m = _RATE.fullmatch(value)
        port["rate"] = number(m["num"]) if m else None
        port["rate_text"] = _text(value)
        return None if port["rate"] is not None else f"rate is not '<n> Gb/sec': {value!r}"
    if label == "link layer":
        port["link_layer"] = _text(value)
        return None if port["link_layer"] else "empty link_layer"
    return f"unknown field {label!r}"


@parser(
    IBSTATUS,
    description="ibstatus: per-port GID, lids, state, physical state, rate, link layer",
)
def parse_ibstatus(text: str) -> ParseResult:
    problems = LineProblems(ignored=True)
    cas: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    port: dict[str, Any] | None = None
    seen: set[str] = set()  # the labels printed in the current block
    where = "ibstatus"

    def close_block() -> None:
        if port is not None:
            missing = [k for k in _IBSTATUS_REQUIRED_LABELS if k not in seen]
            if missing:
                problems.add(f"{where}: missing {', '.join(missing)}")

    for raw in clean(text).split("\n"):
        line = raw.strip()
        if not line:
            continue
        m = _IBSTATUS_HEADER.fullmatch(line)
        if m is not None:
            close_block()
            name, pnum = m["name"], m["port"]
            ports = cas.setdefault(name, {"ports": {}})["ports"]
            where = f"device {name!r} port {pnum}"
            if pnum in ports:
                problems.add(f"{where} listed twice; the last block is kept")
            port = ports[pnum] = dict.fromkeys(_IBSTATUS_KEYS)
            seen = set()
            continue
        if line.lower().startswith(("fatal error", "ibstatus:")):
            errors.append(line)
            problems.add(f"ibstatus reported an error: {line}")
            continue
        kv = split_kv(line)
        label = kv[0].lower().replace("_", " ") if kv else ""
        if kv is None or port is None or label not in _IBSTATUS_LABELS:
            problems.line(where, line)
            continue
        if label in seen:
            problems.add(f"{where}: {label} printed twice; the last is kept")
        seen.add(label)
        issue = _ibstatus_field(port, label, kv[1])
        if issue is not None:
            problems.add(f"{where}: {issue}")
    close_block()

    if not cas:
        reason = f"ibstatus printed no port, only: {errors[0]}" if errors else ""
        return unrecognised(
            IBSTATUS,
            reason or "no \"Infiniband device '<name>' port <n> status:\" block found",
            errors=errors,
        )
    data = {"cas": cas, "errors": errors}
    return ParseResult(IBSTATUS, True, data, problems.result())


# ------------------------------------------------------------------------------------------
# ibv_devinfo

_HCA_KEYS = (
    "transport",
    "transport_code",
    "fw_ver",
    "node_guid",
    "sys_image_guid",
    "vendor_id",
    "vendor_part_id",
    "hw_ver",
    "board_id",
    "phys_port_cnt",
)
# board_id is absent for soft devices (rxe, siw): not required.
_HCA_REQUIRED = (
    "transport",
    "fw_ver",
    "node_guid",
    "sys_image_guid",
    "vendor_id",
    "vendor_part_id",
    "hw_ver",
    "phys_port_cnt",
)
_DEVINFO_PORT_KEYS = (
    "state",
    "state_code",
    "max_mtu",
    "active_mtu",
    "sm_lid",
    "port_lid",
    "port_lmc",
    "link_layer",
    "phys_state",
    "phys_state_code",
    "active_width",
    "active_speed",
    "gids",
)
_DEVINFO_PORT_REQUIRED = (
    "state",
    "max_mtu",
    "active_mtu",
    "sm_lid",
    "port_lid",
    "port_lmc",
    "link_layer",
)
_GID = re.compile(r"GID\[\s*(?P<idx>\d+)\]\s*:\s*(?P<gid>[^,\s]+)\s*(?:,(?P<type>.*))?")
_DEVINFO_ERROR = re.compile(r"(Failed|Couldn't|Could not|No IB devices)\b.*", re.IGNORECASE)
# Lines that only -v / -vv print (used to tell verbose output apart).
_DEVINFO_VERBOSE_ONLY = frozenset(
    {"max_mr_size", "page_size_cap", "max_qp", "phys_state", "active_width", "active_speed"}
)


def _mtu(value: str) -> int | None:
    """``4096 (5)`` -> 4096."""
    m = re.fullmatch(r"(?P<n>\d+)(?:\s*\(\d+\))?", value.strip())
    return to_int(m["n"]) if m else None


def _devinfo_hca_field(hca: dict[str, Any], key: str, value: str) -> bool:
    """Store a device field; False when the value could not be read."""
    if key == "transport":
        hca["transport"], hca["transport_code"] = _name_code(value)
        return hca["transport"] is not None
    if key in ("vendor_part_id", "phys_port_cnt"):
        hca[key] = _int(value)
    else:
        hca[key] = _text(value)
    return hca[key] is not None


def _devinfo_port_field(port: dict[str, Any], key: str, value: str) -> bool | None:
    """Store a port field; False when unreadable, None when the key is not one we keep."""
    if key in ("state", "phys_state"):
        port[key], port[f"{key}_code"] = _name_code(value)
        return port[key] is not None and port[f"{key}_code"] is not None
    if key in ("max_mtu", "active_mtu"):
        port[key] = _mtu(value)
    elif key in ("sm_lid", "port_lid", "port_lmc"):
        port[key] = _int(value)
    elif key == "link_layer":
        port[key] = _text(value)
    elif key == "active_width":
        port[key] = _name_code(value)[0]
    elif key == "active_speed":
        speed = _name_code(value)[0]
        # 'invalid speed (0)' is what the kernel reports for a port that is down
        port[key] = None if speed is None or speed.lower().startswith("invalid") else speed
        return True
    else:
        return None
    return port[key] is not None


@parser(
    IBV_DEVINFO,
    description="ibv_devinfo [-v]: HCAs (fw, GUIDs, part id) and per-port state, MTU, lids",
)
def parse_ibv_devinfo(text: str) -> ParseResult:
    problems = LineProblems(ignored=True)
    hcas: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    warnings: list[str] = []
    hca_name: str | None = None
    port: dict[str, Any] | None = None
    port_name = ""
    verbose = False

    for raw in clean(text).split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("libibverbs:"):
            warnings.append(line)
            continue
        m = re.fullmatch(r"hca_id\s*:\s*(?P<name>\S+)", line)
        if m is not None:
            hca_name, port = m["name"], None
            if hca_name in hcas:
                problems.add(f"hca {hca_name!r} listed twice; the last block is kept")
            hcas[hca_name] = _new_adapter(_HCA_KEYS)
            continue
        if _DEVINFO_ERROR.fullmatch(line):
            errors.append(line)
            problems.add(f"ibv_devinfo reported an error: {line}")
            continue
        if hca_name is None:
            problems.line("before the first hca_id", line)
            continue
        hca = hcas[hca_name]
        m = re.fullmatch(r"port\s*:\s*(?P<n>\d+)", line)
        if m is not None:
            port_name = m["n"]
            if port_name in hca["ports"]:
                problems.add(f"hca {hca_name!r} port {port_name} listed twice; last kept")
            port = hca["ports"][port_name] = dict.fromkeys(_DEVINFO_PORT_KEYS)
            continue
        gid = _GID.fullmatch(line)
        if gid is not None:
            if port is None:
                problems.line(f"hca {hca_name!r} (GID before any port)", line)
                continue
            verbose = True
            gids = port["gids"] if port["gids"] is not None else []
            kind = (gid["type"] or "").strip() or None
            index = to_int(gid["idx"])
            if index is None:
                problems.line(f"hca {hca_name!r} (GID index not a number)", line)
                continue
            gids.append({"index": index, "gid": gid["gid"], "type": kind})
            port["gids"] = gids
            continue
        kv = split_kv(line)
        if kv is None:
            continue  # -v prints flag lists and 'key  = value' lines: not kept
        key, value = kv
        verbose = verbose or key in _DEVINFO_VERBOSE_ONLY
        if port is not None:
            ok = _devinfo_port_field(port, key, value)
            where = f"hca {hca_name!r} port {port_name}"
        elif key in _HCA_KEYS:
            ok = _devinfo_hca_field(hca, key, value)
            where = f"hca {hca_name!r}"
        else:
            continue  # a device capability of -v
        if ok is False:
            problems.add(f"{where}: {key} has no usable value: {value!r}")

    if not hcas:
        reason = f"ibv_devinfo printed no hca_id, only: {errors[0]}" if errors else ""
        return unrecognised(IBV_DEVINFO, reason or "no 'hca_id:' block found", errors=errors)
    for name, hca in hcas.items():
        missing = _missing(hca, _HCA_REQUIRED)
        if missing:
            problems.add(f"hca {name!r}: missing or unreadable {', '.join(missing)}")
        count, ports = hca["phys_port_cnt"], hca["ports"]
        if not ports:
            problems.add(f"hca {name!r}: no 'port:' block")
        elif isinstance(count, int) and count != len(ports):
            problems.add(
                f"hca {name!r}: {len(ports)} of {count} port(s) shown"
                " (ibv_devinfo -i <port>, or truncated output)"
            )
        for pname, p in ports.items():
            missing = _missing(p, _DEVINFO_PORT_REQUIRED)
            if missing:
                problems.add(
                    f"hca {name!r} port {pname}: missing or unreadable {', '.join(missing)}"
                )
    data = {"hcas": hcas, "verbose": verbose, "errors": errors, "warnings": warnings}
    return ParseResult(IBV_DEVINFO, True, data, problems.result())


# ------------------------------------------------------------------------------------------
# ibdev2netdev

_MAPPING = re.compile(
    r"(?P<device>\S+)\s+port\s+(?P<port>\d+)\s+==>\s+(?P<netdev>\S+)\s+"
    r"\((?P<state>[^()]*)\)(?P<rest>.*)"
)
_MAPPING_VERBOSE = re.compile(
    r"(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+(?P<device>\S+)\s+"
    r"\((?P<hca_type>[^()]*?)\s+-\s+(?P<part>[^()]*?)\s*\)\s*(?P<desc>.*?)\s*"
    r"\bfw\s+(?P<fw>\S+)\s+port\s+(?P<port>\d+)\s+\((?P<port_state>[^()]*)\)\s+==>\s+"
    r"(?P<netdev>\S+)\s+\((?P<state>[^()]*)\)(?P<rest>.*)"
)
_PAREN = re.compile(r"\(([^()]*)\)")


def _extra(rest: str) -> tuple[str | None, bool]:
    """Text in parentheses after the link state: (text or None, True), or (None, False) when
    something else follows (named in problems, not guessed at)."""
    if not rest.strip():
        return None, True
    groups = [g.strip() for g in _PAREN.findall(rest)]
    if groups and not _PAREN.sub("", rest).strip():
        return ", ".join(groups), True
    return None, False


@parser(
    IBDEV2NETDEV,
    description="ibdev2netdev [-v]: RDMA device/port to net interface mapping and link state",
)
def parse_ibdev2netdev(text: str) -> ParseResult:
    problems = LineProblems(ignored=True)
    mappings: list[dict[str, Any]] = []
    for raw in clean(text).split("\n"):
        line = raw.strip()
        if not line:
            continue
        mv = _MAPPING_VERBOSE.fullmatch(line)
        m = mv or _MAPPING.fullmatch(line)
        if m is None:
            problems.line("ibdev2netdev", line)
            continue
        port = to_int(m["port"])
        if port is None:
            problems.line("ibdev2netdev (port not a number)", line)
            continue
        extra, tidy = _extra(m["rest"])
        entry: dict[str, Any] = {
            "device": m["device"],
            "port": port,
            "netdev": _text(m["netdev"]),
            "state": _text(m["state"]),
            "extra": extra,
            "pci_address": mv["pci"] if mv else None,
            "hca_type": _text(mv["hca_type"]) if mv else None,
            "part_number": _text(mv["part"]) if mv else None,
            "description": _text(mv["desc"]) if mv else None,
            "fw_ver": _text(mv["fw"]) if mv else None,
            "port_state": _text(mv["port_state"]) if mv else None,
        }
        where = f"{entry['device']} port {entry['port']}"
        if not tidy:
            problems.add(f"{where}: unexpected text after the link state: {m['rest'].strip()!r}")
        if entry["state"] not in ("Up", "Down"):
            problems.add(f"{where}: link state {m['state']!r} is neither Up nor Down")
        if entry["netdev"] is None:
            problems.add(f"{where}: no net device ({m['netdev']!r})")
        mappings.append(entry)
    if not mappings:
        return unrecognised(IBDEV2NETDEV, "no '<dev> port <n> ==> <netdev> (<state>)' line found")
    return ParseResult(IBDEV2NETDEV, True, {"mappings": mappings}, problems.result())
