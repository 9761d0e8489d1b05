"""NVIDIA (Mellanox) adapter firmware: ``mlxfwmanager --query`` / ``mlxup --query`` and
``flint -d DEV query`` (also ``mstflint -d BDF q``, which prints the same).

What real outputs look like, and how this module copes (contract: docs/parse.md):

- ``mlxfwmanager --query`` and ``mlxup --query``: a ``Querying Mellanox devices firmware ...``
  banner, then one ``Device #N:`` block per adapter (underlined with dashes) holding
  ``Label:<padding>value`` lines, a ``Versions:  Current  Available`` header followed by one row
  per image (``FW``, ``PXE``, ``UEFI``, ``NVMe``, ...; the name may carry ``(Running)``), and a
  ``Status:`` line. ``N/A`` (no image given, no GUID) is None. Columns are runs of blanks.
- ``flint query``: ``Label:<padding>value`` lines; ``Rom Info:`` continues on lines indented
  under the value (``type=PXE version=3.6.502 cpu=AMD64``); ``Base GUID`` and ``Base MAC`` carry
  a second column, how many GUIDs/MACs follow (under a ``Description: UID GuidsNumber`` header).
  Labels this parser does not know are kept in ``other``.
"""

from __future__ import annotations

import re
from typing import Any

from gpuctl.validation.numbers import number
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

MLXFWMANAGER = "mlxfwmanager"
FLINT_QUERY = "flint-query"

_PLACEHOLDERS = frozenset({"", "N/A", "n/a", "NA", "-", "--"})
_MAX_LINE_PROBLEMS = 5

_BANNER = re.compile(r"^\s*Querying (?:Mellanox|NVIDIA) devices firmware", re.IGNORECASE)
_DEVICE = re.compile(r"^\s*Device\s*#\s*(\d+)\s*:\s*$")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ()/_.-]*?)\s*:\s*(.*?)\s*$")
_VERSIONS_HEADER = re.compile(r"^\s*Versions\s*:\s*Current\s+Available\s*$", re.IGNORECASE)
_SPLIT = re.compile(r"\s{2,}|\t+")

_DEVICE_FIELDS = {
    "device type": "device_type",
    "part number": "part_number",
    "description": "description",
    "psid": "psid",
    "pci device name": "pci_device_name",
    "base guid": "base_guid",
    "base mac": "base_mac",
    "status": "status",
}


def _value(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return None if text in _PLACEHOLDERS else text


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []
        self._lines = 0

    def add(self, message: str) -> None:
        self.items.append(message)

    def line(self, where: str, line: str) -> None:
        self._lines += 1
        if self._lines <= _MAX_LINE_PROBLEMS:
            self.items.append(f"{where}: unrecognised line {line.strip()[:120]!r}")

    def result(self) -> tuple[str, ...]:
        extra = self._lines - _MAX_LINE_PROBLEMS
        if extra > 0:
            return (*self.items, f"{extra} more unrecognised line(s)")
        return tuple(self.items)


def _new_device() -> dict[str, Any]:
    device: dict[str, Any] = dict.fromkeys(_DEVICE_FIELDS.values())
    device["versions"] = {}
    return device


@parser(
    MLXFWMANAGER,
    description="mlxfwmanager --query / mlxup --query: per adapter PSID, GUID/MAC, FW/PXE/UEFI "
    "versions, status",
    command=("mlxfwmanager", "--query"),
)
def parse_mlxfwmanager(text: str) -> ParseResult:
    try:
        return _parse_mlxfwmanager(text)
    except Exception as exc:
        return unrecognised(MLXFWMANAGER, f"parser error: {type(exc).__name__}")


def _parse_mlxfwmanager(text: str) -> ParseResult:
    lines = clean(text).split("\n")
    if not any(_DEVICE.match(line) for line in lines):
        if any(_BANNER.match(line) for line in lines):
            banner_errors = [ln.strip() for ln in lines if ln.strip().startswith("-E-")]
            reason = banner_errors[0] if banner_errors else "no 'Device #N:' block after the banner"
            return unrecognised(MLXFWMANAGER, reason)
        return unrecognised(MLXFWMANAGER, "no 'Device #N:' block: not mlxfwmanager --query output")
    problems = _Problems()
    devices: list[dict[str, Any]] = []
    errors: list[str] = []
    device: dict[str, Any] | None = None
    in_versions = False
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or _BANNER.match(line) or re.fullmatch(r"-{3,}", stripped):
            if not stripped:
                in_versions = False
            continue
        match = _DEVICE.match(line)
        if match:
            device = _new_device()
            devices.append(device)
            in_versions = False
            continue
        if stripped.startswith(("-E-", "-W-", "-I-")):
            if stripped.startswith("-E-"):
                errors.append(stripped)
            continue
        if device is None:
            if not stripped.lower().startswith(("log file", "found ")):
                problems.line("before the first device", line)
            continue
        if _VERSIONS_HEADER.match(line):
            in_versions = True
            continue
        if in_versions:
            cells = _SPLIT.split(stripped)
            if len(cells) == 3 and not cells[0].endswith(":"):
                name = cells[0]
                if name in device["versions"]:
                    problems.add(f"device #{len(devices)}: version {name!r} shown twice")
                device["versions"][name] = {
                    "current": _value(cells[1]),
                    "available": _value(cells[2]),
                }
                continue
            in_versions = False
        field = _FIELD.match(line)
        if field:
            key = _DEVICE_FIELDS.get(field.group(1).lower())
            if key is not None:
                device[key] = _value(field.group(2))
                continue
        problems.line(f"device #{len(devices)}", line)
    if not any(dev["psid"] or dev["device_type"] or dev["versions"] for dev in devices):
        return unrecognised(MLXFWMANAGER, "'Device #N:' blocks without PSID, type or versions")
    for i, dev in enumerate(devices, 1):
        if "FW" not in dev["versions"]:
            problems.add(f"device #{i}: no FW version row")
        if dev["psid"] is None:
            problems.add(f"device #{i}: no PSID")
        if dev["status"] is None:
            problems.add(f"device #{i}: no Status line (output cut short?)")
    for error in errors:
        problems.add(error)
    return ParseResult(
        kind=MLXFWMANAGER,
        recognised=True,
        data={"devices": devices},
        problems=problems.result(),
    )


# ------------------------------------------------------------------------------------------
# flint query

_FLINT_FIELDS = {
    "image type": "image_type",
    "fw version": "fw_version",
    "fw release date": "fw_release_date",
    "product version": "product_version",
    "psid": "psid",
    "security attributes": "security_attributes",
    "image vsd": "image_vsd",
    "device vsd": "device_vsd",
}
_ROM = re.compile(r"^type=(\S+)((?:\s+\w+=\S+)*)\s*$")


def _rom_entry(text: str) -> dict[str, Any] | None:
    match = _ROM.match(text.strip())
    if not match:
        return None
    entry: dict[str, Any] = {"type": match.group(1), "version": None, "cpu": None}
    for pair in match.group(2).split():
        key, _, value = pair.partition("=")
        entry[key] = _value(value)
    return entry


@parser(
    FLINT_QUERY,
    description="flint -d <device> query: FW/product version, PSID, GUID/MAC, ROM info",
    command=("flint", "-d", "<device>", "query"),
)
def parse_flint_query(text: str) -> ParseResult:
    try:
        return _parse_flint_query(text)
    except Exception as exc:
        return unrecognised(FLINT_QUERY, f"parser error: {type(exc).__name__}")


def _parse_flint_query(text: str) -> ParseResult:
    lines = clean(text).split("\n")
    fields = [m for m in (_FIELD.match(line) for line in lines) if m]
    labels = {m.group(1).strip().lower() for m in fields}
    if not any(label.startswith("fw version") for label in labels) or not (
        labels & {"psid", "image type", "product version"}
    ):
        errors = [ln.strip() for ln in lines if ln.strip().startswith("-E-")]
        reason = errors[0] if errors else "no 'FW Version:' and 'PSID:' lines: not flint query"
        return unrecognised(FLINT_QUERY, reason)
    problems = _Problems()
    data: dict[str, Any] = dict.fromkeys(_FLINT_FIELDS.values())
    data.update(
        base_guid=None, base_guid_count=None, base_mac=None, base_mac_count=None, rom_info=[]
    )
    other: dict[str, str | None] = {}
    in_rom = False
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            in_rom = False
            continue
        if stripped.startswith(("-E-", "-W-", "-I-")):
            if stripped.startswith("-E-"):
                problems.add(stripped)
            continue
        if in_rom and raw[:1].isspace():
            entry = _rom_entry(stripped)
            if entry is not None:
                data["rom_info"].append(entry)
            else:
                problems.line("Rom Info", line)
            continue
        in_rom = False
        field = _FIELD.match(line)
        if not field:
            problems.line("flint query", line)
            continue
        label, value = field.group(1).strip().lower(), field.group(2)
        if label == "rom info":
            in_rom = True
            if _value(value) is not None:
                entry = _rom_entry(value)
                if entry is None:
                    problems.line("Rom Info", line)
                else:
                    data["rom_info"].append(entry)
            continue
        if label in ("base guid", "base mac"):
            key = label.replace(" ", "_")
            cells = value.split()
            data[key] = _value(cells[0]) if cells else None
            if len(cells) > 1:
                data[f"{key}_count"] = number(cells[1])
            continue
        if label == "description" and re.fullmatch(r"UID\s+GuidsNumber", value.strip()):
            continue  # the column header of the Base GUID/MAC lines
        if label == "fw version(running)" or label == "fw version (running)":
            data["fw_version_running"] = _value(value)
            continue
        key = _FLINT_FIELDS.get(label)
        if key is not None:
            data[key] = _value(value)
        else:
            other[field.group(1).strip()] = _value(value)
    data["other"] = other
    if data["fw_version"] is None:
        problems.add("no FW Version value")
    return ParseResult(kind=FLINT_QUERY, recognised=True, data=data, problems=problems.result())
