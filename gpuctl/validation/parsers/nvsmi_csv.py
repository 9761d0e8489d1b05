"""``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``: the ``smi-csv`` kind
(docs/parse.md). Cells with nvidia-smi's placeholders are None, read failures None and a
problem; identifiers and versions stay strings, numbers go through gpuctl.validation.numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpuctl.validation.numbers import looks_numeric, number
from gpuctl.validation.parsers.nvsmi_tree import (
    ERROR_VALUES,
    NUM_UNIT,
    PLACEHOLDERS,
    is_error_banner,
)
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND_CSV = "smi-csv"

# ------------------------------------------------------------------------------------------
# smi-csv

_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?:\s*\[([^\]]*)\])?")
# Query fields whose values are identifiers or versions: kept as strings, never numbers.
_TEXT_FIELDS = re.compile(
    r"(^|\.)(name|serial|uuid|timestamp|hostname|driver_version|vbios_version|compute_cap)$"
    r"|^(pci|inforom|gpu_name|gpu_bus_id|gpu_serial|gpu_uuid)(\.|$)|guid|uuid|serial|version",
    re.IGNORECASE,
)
_DOTLESS_FIELDS = frozenset(
    {"timestamp", "count", "name", "serial", "uuid", "index", "pstate", "hostname"}
)


def _field_name(cell: str) -> tuple[str, str | None] | None:
    m = _FIELD.fullmatch(cell.strip())
    return (m.group(1), m.group(2)) if m else None


def _looks_like_header(cells: list[str]) -> bool:
    names = [_field_name(c) for c in cells]
    if not names or any(n is None for n in names):
        return False
    return any(
        n is not None and ("." in n[0] or "_" in n[0] or n[0].lower() in _DOTLESS_FIELDS)
        for n in names
    )


def _csv_value(name: str, unit: str | None, cell: str | None) -> tuple[Any, bool]:
    """(value, read_error) for one cell."""
    if cell is None:
        return None, False
    low = cell.strip().lower()
    if low in ERROR_VALUES:
        return None, True
    if low == "" or low in PLACEHOLDERS or (low.startswith("[") and low.endswith("]")):
        return None, False
    if _TEXT_FIELDS.search(name):
        return cell, False
    m = NUM_UNIT.fullmatch(cell.strip())
    if m and (m.group(2) == "" or (unit is not None and m.group(2) == unit.strip())):
        n = number(m.group(1))
        return (None, True) if n is None else (n, False)  # None: 5,000 digits
    bare = cell.strip()
    if unit is not None and unit.strip() and bare.endswith(unit.strip()):
        bare = bare[: -len(unit.strip())]
    if looks_numeric(bare) and number(bare) is None:
        return None, True  # nan, inf, 1e400, 1e308: no reading, not a number to keep as text
    return cell, False


@parser(
    KIND_CSV,
    description="nvidia-smi --query-gpu=... --format=csv (noheader: pass fields)",
    options=("fields",),
)
def parse_smi_csv(text: str, fields: Sequence[str] | str | None = None) -> ParseResult:
    lines = [line.strip() for line in clean(text).split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        return unrecognised(KIND_CSV, "empty input")
    banners = [line for line in lines if is_error_banner(line)]
    lines = [line for line in lines if not is_error_banner(line)]
    problems = [f"error message in output: {b}" for b in banners]
    if isinstance(fields, str):
        fields = fields.split(",")
    given = [f.strip() for f in fields or () if f.strip()]

    first = [c.strip() for c in lines[0].split(",")] if lines else []
    header_in_text = True
    if given:
        header, header_in_text = given, False
        want = [(_field_name(f) or (f, None))[0].lower() for f in given]
        got = [(_field_name(c) or (c, None))[0].lower() for c in first]
        if first and got == want:
            header, lines, header_in_text = first, lines[1:], True
    elif lines and _looks_like_header(first):
        header, lines = first, lines[1:]
    else:
        reason = "no CSV header line (for --format=csv,noheader pass the fields option)"
        return unrecognised(KIND_CSV, f"{reason}: {banners[0]}" if banners else reason)
    split = [[c.strip() for c in line.split(",")] for line in lines]
    if not header_in_text and not any(len(cells) == len(header) for cells in split):
        return unrecognised(
            KIND_CSV, f"no line has the {len(header)} comma-separated cell(s) the fields name"
        )

    parsed = [_field_name(h) or (h, None) for h in header]
    rows: list[dict[str, Any]] = []
    values: list[dict[str, Any]] = []
    read_errors: list[str] = []
    for row_number, cells in enumerate(split, start=1):
        if cells == header:
            continue  # the header printed again (pasted twice, or several runs)
        if len(cells) != len(header):
            problems.append(f"row {row_number} has {len(cells)} cell(s), the header {len(header)}")
        row: dict[str, Any] = {}
        value_row: dict[str, Any] = {}
        for i, (label, (name, unit)) in enumerate(zip(header, parsed, strict=True)):
            cell = cells[i] if i < len(cells) else None
            row[label] = cell
            value, failed = _csv_value(name, unit, cell)
            value_row[label] = value
            if failed:
                read_errors.append(f"row {row_number} {label}: {cell!r}")
        rows.append(row)
        values.append(value_row)
    if not rows:
        problems.append("header but no data rows")
    if read_errors:
        more = f" (and {len(read_errors) - 3} more)" if len(read_errors) > 3 else ""
        problems.append(f"read errors: {'; '.join(read_errors[:3])}{more}")
    data = {
        "header": header,
        "fields": [name for name, _ in parsed],
        "units": [unit for _, unit in parsed],
        "rows": rows,
        "values": values,
    }
    return ParseResult(KIND_CSV, True, data, tuple(problems))
