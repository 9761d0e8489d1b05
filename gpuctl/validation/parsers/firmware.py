"""NVIDIA (Mellanox) adapter firmware: ``mlxfwmanager --query`` / ``mlxup --query`` and
``flint -d DEV query`` (also ``mstflint -d BDF q``, which prints the same).

One reader of each layout, for two callers: the ``mlxfwmanager`` and ``flint-query`` parsers
(``gpuctl parse``, lenient: what they cannot read is a problem) and the rollout
(:mod:`gpuctl.rollout.tools`, strict: any line out of place fails the node). ``scan_*`` return
a typed record of the output: the values as printed, and in line order every line that did not
fit the layout (:class:`Note`); each caller decides what a note means to it.

What real outputs look like, and how this module copes (contract: docs/parse.md):

- ``mlxfwmanager --query`` and ``mlxup --query``: a ``Querying Mellanox devices firmware ...``
  banner, then one ``Device #N:`` block per adapter (underlined with ten dashes) holding
  ``Label:<padding>value`` lines, a ``Versions:  Current  Available`` header followed by one row
  per image (``FW``, ``PXE``, ``UEFI``, ``NVMe``, ...; after a burn not yet loaded an extra
  ``FW (Running)`` row, sorted among the ROM rows), and a ``Status:`` line. Release notes may
  follow a status; ``mlxfwmanager -u`` prints a ``---------`` trailer (nine dashes) after the
  query part, and what follows it is not query output. ``N/A`` (no image given, no GUID) is
  None. Columns are runs of blanks (mstflint ``mlxfwupdate/mlxfwmanager.cpp``).
- ``flint query``: ``Label:<padding>value`` lines; ``Rom Info:`` continues on lines indented
  under the value (``type=PXE version=3.6.502 cpu=AMD64``); ``Base GUID`` and ``Base MAC`` carry
  a second column, how many GUIDs/MACs follow (under a ``Description: UID GuidsNumber`` header).
  ``FW Version(Running):`` is shown only when the running firmware differs from the flashed one
  (mstflint ``flint/subcommands.cpp``). Labels this parser does not know are kept in ``other``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuctl.validation.numbers import number, to_int
from gpuctl.validation.parsing import LineProblems, ParseResult, clean, parser, unrecognised

MLXFWMANAGER = "mlxfwmanager"
FLINT_QUERY = "flint-query"

_PLACEHOLDERS = frozenset({"", "N/A", "n/a", "NA", "-", "--"})

_BANNER = re.compile(r"^\s*Querying (?:Mellanox|NVIDIA) devices firmware", re.IGNORECASE)
_DEVICE = re.compile(r"^\s*Device\s*#\s*(\d+)\s*:\s*$")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ()/_.-]*?)\s*:\s*(.*?)\s*$")
_VERSIONS_HEADER = re.compile(r"^\s*Versions\s*:\s*Current(?:\s+Available)?\s*$", re.IGNORECASE)
_SPLIT = re.compile(r"\s{2,}|\t+")
_UNDERLINE = re.compile(r"-{10}")  # under "Device #N:"
# the exact layout mlxfwmanager prints (a line read by the patterns above but not in this form is
# a "layout" note: the rollout refuses it, the lenient parser does not mind)
_EXACT_BANNER = re.compile(r"^Querying (?:Mellanox|NVIDIA) devices firmware \.\.\.$")
_EXACT_DEVICE = re.compile(r"^Device #(\d+):$")
_EXACT_LABEL = re.compile(r"^  ([A-Za-z][A-Za-z0-9 ()/_.-]*?):\s*(.*?)\s*$")
_EXACT_VERSIONS = re.compile(r"^  Versions:\s+(?:Current\s+Available|Current)\s*$")
_EXACT_ROW = re.compile(r"^ {3,}(\S(?:.*?\S)?) {2,}(\S+)(?: +(\S+))?\s*$")
_TRAILER = "---------"  # nine dashes: the end of the query part of ``mlxfwmanager -u``

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


# ------------------------------------------------------------------------------------------
# The typed records

NoteKind = Literal[
    "error",  # a "-E-" line (text: the line, stripped)
    "unknown",  # a line that fits nowhere in the layout
    "noise",  # a line the tools print around the layout (dashes, -W-/-I- in a block, "Log File")
    "layout",  # a line read, but not in the exact layout (indentation, spelling)
    "underline",  # the line after "Device #N:" is not ten dashes
    "bad-number",  # "Device #N:" with a number no tool prints (text: N)
    "duplicate",  # an image row shown twice in one device (text: the image name)
    "unknown-label",  # a "Label: value" line whose label this module does not know
    "after-status",  # a line after a device's Status line (release notes)
    "rom",  # a Rom Info entry not understood (flint)
]


@dataclass(frozen=True, slots=True)
class Note:
    """One line that did not fit the layout, in output order. ``device``: the 1-based position
    of the ``Device #N:`` block it is in, None before the first (always None for flint)."""

    kind: NoteKind
    text: str
    device: int | None = None


@dataclass(frozen=True, slots=True)
class ImageVersion:
    """One row of a device's ``Versions:`` table, cells as printed (``N/A`` included);
    ``available`` is None when the table has no ``Available`` column."""

    current: str
    available: str | None


@dataclass(frozen=True, slots=True)
class AdapterQuery:
    """One ``Device #N:`` block of ``mlxfwmanager --query``. Values as printed (``N/A`` kept,
    stripped); None when the block has no such line (the last one wins when shown twice)."""

    number: str  # the N of "Device #N:", as printed
    device_type: str | None = None
    part_number: str | None = None
    description: str | None = None
    psid: str | None = None
    pci_device_name: str | None = None
    base_guid: str | None = None
    base_mac: str | None = None
    status: str | None = None
    versions: Mapping[str, ImageVersion] | None = None  # image name -> row (last one wins)

    def to_json(self) -> dict[str, Any]:
        """The ``devices[]`` entry of the ``mlxfwmanager`` kind (docs/parse.md)."""
        device: dict[str, Any] = {k: _value(getattr(self, k)) for k in _DEVICE_FIELDS.values()}
        device["versions"] = {
            name: {"current": _value(row.current), "available": _value(row.available)}
            for name, row in (self.versions or {}).items()
        }
        return device


@dataclass(frozen=True, slots=True)
class MlxfwmanagerQuery:
    """What ``mlxfwmanager --query`` printed up to its trailer."""

    banner: bool  # a "Querying ... devices firmware" line was seen
    devices: tuple[AdapterQuery, ...]
    notes: tuple[Note, ...]


@dataclass(frozen=True, slots=True)
class FlintField:
    """One ``Label: value`` line of ``flint query``, label and value stripped."""

    label: str
    value: str
    indented: bool  # flint prints labels in the first column; an indented one is out of place


@dataclass(frozen=True, slots=True)
class FlintQuery:
    """What ``flint -d DEV query`` printed: every ``Label: value`` line, in order;
    ``rom_info`` from ``Rom Info:`` and its continuation lines."""

    fields: tuple[FlintField, ...]
    rom_info: tuple[dict[str, Any], ...]
    notes: tuple[Note, ...]

    def first(self, label: str) -> str | None:
        """The value of the first line in the first column with exactly ``label``, or None."""
        return next((f.value for f in self.fields if f.label == label and not f.indented), None)


# ------------------------------------------------------------------------------------------
# mlxfwmanager --query


def scan_mlxfwmanager(lines: Iterable[str]) -> MlxfwmanagerQuery:
    """Read ``mlxfwmanager --query`` output, given as its lines (callers clean them their way)."""
    banner = False
    blocks: list[dict[str, Any]] = []
    notes: list[Note] = []
    block: dict[str, Any] | None = None
    section = "preamble"  # preamble | underline | labels | versions | closed | trailer
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        where = len(blocks) or None
        if not stripped:
            if section == "versions":
                section = "labels"
            continue
        if stripped.startswith("-E-"):
            notes.append(Note("error", stripped, where))
            continue
        if section == "trailer" or (section == "closed" and line == _TRAILER):
            section = "trailer"  # what follows is the update, not the query (errors still count)
            continue
        match = _DEVICE.match(line)
        if match:
            if not _EXACT_DEVICE.match(line):
                notes.append(Note("layout", line, where))
            block = {"number": match.group(1), "versions": {}}
            blocks.append(block)
            if to_int(match.group(1)) is None:
                notes.append(Note("bad-number", match.group(1), len(blocks)))
            section = "underline"
            continue
        if _BANNER.match(line):
            banner = True
            if section != "preamble":
                notes.append(Note("noise", line, where))
            elif not _EXACT_BANNER.match(line):
                notes.append(Note("layout", line))
            continue
        if block is None:
            if stripped.startswith(("-W-", "-I-")):
                if not line.startswith(("-W-", "-I-")):
                    notes.append(Note("layout", line))
                continue
            lower = stripped.lower()
            dashes = re.fullmatch(r"-{3,}", stripped)
            noise = dashes or lower.startswith(("log file", "found "))
            notes.append(Note("noise" if noise else "unknown", line))
            continue
        if section == "underline":
            section = "labels"
            if _UNDERLINE.fullmatch(line):
                continue
            notes.append(Note("underline", line, where))
        if re.fullmatch(r"-{3,}", stripped) or stripped.startswith(("-W-", "-I-")):
            if section != "closed":
                notes.append(Note("noise", line, where))
            continue
        if section == "closed":
            notes.append(Note("after-status", line, where))
            continue
        if _VERSIONS_HEADER.match(line):
            if not _EXACT_VERSIONS.match(line):
                notes.append(Note("layout", line, where))
            section = "versions"
            continue
        if section == "versions":
            cells = _SPLIT.split(stripped)
            if len(cells) in (2, 3) and not cells[0].endswith(":"):
                exact = _EXACT_ROW.match(line)
                if not exact or [c for c in exact.groups() if c is not None] != cells:
                    notes.append(Note("layout", line, where))
                name = cells[0]
                if name in block["versions"]:
                    notes.append(Note("duplicate", name, where))
                available = cells[2] if len(cells) == 3 else None
                block["versions"][name] = ImageVersion(cells[1], available)
                continue
            section = "labels"
        field = _FIELD.match(line)
        if not field:
            notes.append(Note("unknown", line, where))
            continue
        exact = _EXACT_LABEL.match(line)
        if not exact or exact.group(1) != field.group(1):
            notes.append(Note("layout", line, where))
        key = _DEVICE_FIELDS.get(field.group(1).lower())
        if key is None:
            notes.append(Note("unknown-label", line, where))
            continue
        block[key] = field.group(2).strip()
        if key == "status":
            section = "closed"
    devices = tuple(AdapterQuery(**b) for b in blocks)
    return MlxfwmanagerQuery(banner=banner, devices=devices, notes=tuple(notes))


@parser(
    MLXFWMANAGER,
    description="mlxfwmanager --query / mlxup --query: per adapter PSID, GUID/MAC, FW/PXE/UEFI "
    "versions, status",
)
def parse_mlxfwmanager(text: str) -> ParseResult:
    try:
        return _parse_mlxfwmanager(text)
    except Exception as exc:
        return unrecognised(MLXFWMANAGER, f"parser error: {type(exc).__name__}")


def _parse_mlxfwmanager(text: str) -> ParseResult:
    scan = scan_mlxfwmanager(clean(text).split("\n"))
    errors = [note.text for note in scan.notes if note.kind == "error"]
    if not scan.devices:
        if scan.banner:
            reason = errors[0] if errors else "no 'Device #N:' block after the banner"
            return unrecognised(MLXFWMANAGER, reason)
        return unrecognised(MLXFWMANAGER, "no 'Device #N:' block: not mlxfwmanager --query output")
    problems = LineProblems()
    for note in scan.notes:
        where = "before the first device" if note.device is None else f"device #{note.device}"
        if note.kind in ("unknown", "unknown-label", "after-status"):
            problems.line(where, note.text)
        elif note.kind == "duplicate":
            problems.add(f"{where}: version {note.text!r} shown twice")
    devices = [device.to_json() for device in scan.devices]
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


def scan_flint_query(lines: Iterable[str]) -> FlintQuery:
    """Read ``flint query`` output, given as its lines (callers clean them their way)."""
    fields: list[FlintField] = []
    rom_info: list[dict[str, Any]] = []
    notes: list[Note] = []
    in_rom = False
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            in_rom = False
            continue
        if stripped.startswith(("-E-", "-W-", "-I-")):
            if stripped.startswith("-E-"):
                notes.append(Note("error", stripped))
            continue
        if in_rom and raw[:1].isspace():
            entry = _rom_entry(stripped)
            if entry is not None:
                rom_info.append(entry)
            else:
                notes.append(Note("rom", line))
            continue
        in_rom = False
        field = _FIELD.match(line)
        if not field:
            notes.append(Note("unknown", line))
            continue
        label, value = field.group(1).strip(), field.group(2)
        if label.lower() == "rom info":
            in_rom = True
            if _value(value) is not None:
                entry = _rom_entry(value)
                if entry is None:
                    notes.append(Note("rom", line))
                else:
                    rom_info.append(entry)
            continue
        fields.append(FlintField(label, value, indented=raw[:1].isspace()))
    return FlintQuery(fields=tuple(fields), rom_info=tuple(rom_info), notes=tuple(notes))


@parser(
    FLINT_QUERY,
    description="flint -d <device> query: FW/product version, PSID, GUID/MAC, ROM info",
)
def parse_flint_query(text: str) -> ParseResult:
    try:
        return _parse_flint_query(text)
    except Exception as exc:
        return unrecognised(FLINT_QUERY, f"parser error: {type(exc).__name__}")


def _parse_flint_query(text: str) -> ParseResult:
    scan = scan_flint_query(clean(text).split("\n"))
    labels = {field.label.lower() for field in scan.fields}
    if not any(label.startswith("fw version") for label in labels) or not (
        labels & {"psid", "image type", "product version"}
    ):
        errors = [note.text for note in scan.notes if note.kind == "error"]
        reason = errors[0] if errors else "no 'FW Version:' and 'PSID:' lines: not flint query"
        return unrecognised(FLINT_QUERY, reason)
    problems = LineProblems()
    for note in scan.notes:
        if note.kind == "error":
            problems.add(note.text)
        else:
            problems.line("Rom Info" if note.kind == "rom" else "flint query", note.text)
    data: dict[str, Any] = dict.fromkeys(_FLINT_FIELDS.values())
    data.update(
        base_guid=None,
        base_guid_count=None,
        base_mac=None,
        base_mac_count=None,
        rom_info=list(scan.rom_info),
    )
    other: dict[str, str | None] = {}
    for field in scan.fields:
        name, value = field.label, field.value
        label = name.lower()
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
        known = _FLINT_FIELDS.get(label)
        if known is not None:
            data[known] = _value(value)
        else:
            other[name] = _value(value)
    data["other"] = other
    if data["fw_version"] is None:
        problems.add("no FW Version value")
    return ParseResult(kind=FLINT_QUERY, recognised=True, data=data, problems=problems.result())
