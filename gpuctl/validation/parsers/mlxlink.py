"""``mlxlink`` (``mlxlink -d <hca> -m [-c]``): an adapter port's link, module and BER.

What real outputs look like, and how this module copes (contract: docs/parse.md):

- ``mlxlink``: sections (``Operational Info``, ``Module Info``, ...) underlined with dashes, then
  ``Label<padding>: value`` lines. Module values carry ranges (``54 [-5..75]``) and per-lane
  comma lists (``8.380,8.380,8.380,8.380 [2..15]``); ``N/A`` is None. The module section is the
  mapping the contract names; the other sections are kept beside it, read the same way.
"""

from __future__ import annotations

import re
from typing import Any

from gpuctl.validation.numbers import looks_numeric, number
from gpuctl.validation.parsers.infiniband import PLACEHOLDERS, snake_key, split_kv
from gpuctl.validation.parsing import LineProblems, ParseResult, clean, parser, unrecognised

MLXLINK = "mlxlink"


_DASHES = re.compile(r"-{3,}")
# mlxlink section titles: 'Operational Info', 'Tool Information', 'Physical Counters and BER Info'
_SECTION_TITLE = re.compile(r"[A-Za-z][\w ().,/&+-]*\b(?:Info|Information)")
_RANGE = re.compile(r"(?P<body>.*?)\s*\[(?P<lo>[-+]?\d+(?:\.\d+)?)\.\.(?P<hi>[-+]?\d+(?:\.\d+)?)\]")
# Fields that are identifiers even when they look like numbers (Rev '00', a serial, '3.6').
_MLXLINK_TEXT_FIELDS = frozenset(
    {
        "firmware_version",
        "amber_version",
        "mft_version",
        "identifier",
        "vendor_name",
        "vendor_part_number",
        "vendor_serial_number",
        "rev",
        "fw_version",
        "oui",
        "manufacturing_date",
    }
)
_MODULE_SECTION = "module_info"


def _lane_item(item: str) -> int | float | str | None:
    item = item.strip()
    if item in PLACEHOLDERS:
        return None
    value = number(item)
    if value is None and looks_numeric(item):
        return None  # a number no module reports (nan, 1e400, 5,000 digits): unknown
    return item if value is None else value


def _mlxlink_value(key: str, value: str) -> tuple[Any, dict[str, Any] | None]:
    """(value, range) of one field; see the contract for the rules."""
    body = value.strip()
    limits: dict[str, Any] | None = None
    m = _RANGE.fullmatch(body)
    if m is not None:
        body = m["body"].strip()
        limits = {"min": number(m["lo"]), "max": number(m["hi"])}
    if body in PLACEHOLDERS:
        return None, limits
    if key in _MLXLINK_TEXT_FIELDS:
        return body, limits
    if "," in body:
        items = [_lane_item(i) for i in body.split(",")]
        if key.endswith("per_lane") or all(not isinstance(i, str) for i in items):
            return items, limits
        return body, limits
    parsed = number(body)
    if parsed is None and looks_numeric(body):
        return None, limits  # a number no module reports: unknown, not kept as text
    return (body if parsed is None else parsed), limits


@parser(
    MLXLINK,
    description="mlxlink -m: transceiver module info (temperature, voltage, per-lane power)",
)
def parse_mlxlink(text: str) -> ParseResult:
    problems = LineProblems(ignored=True)
    sections: dict[str, dict[str, Any]] = {}
    module: dict[str, Any] | None = None
    errors: list[str] = []
    warnings: list[str] = []
    lines = [raw.strip() for raw in clean(text).split("\n")]
    section: str | None = None

    for i, line in enumerate(lines):
        if not line or _DASHES.fullmatch(line):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        # An underlined '... Info' title starts mlxlink output; after one, any underlined title
        # without a colon is a section ('Histogram of FEC Errors').
        known = _SECTION_TITLE.fullmatch(line) or (
            ":" not in line and (section is not None) and bool(snake_key(line))
        )
        if known and _DASHES.fullmatch(following):
            section = snake_key(line)
            if section in sections or (section == _MODULE_SECTION and module is not None):
                problems.add(f"section {line!r} printed twice; the last is kept")
            if section == _MODULE_SECTION:
                module = {}
            else:
                sections[section] = {}
            continue
        if line.startswith("-E-"):
            errors.append(line)
            problems.add(f"mlxlink reported an error: {line}")
            continue
        if line.startswith(("-W-", "-I-")):
            warnings.append(line)
            continue
        kv = split_kv(line)
        if kv is None or section is None:
            problems.line(section or "before the first section header", line)
            continue
        key = snake_key(kv[0])
        if not key:
            problems.line(section, line)
            continue
        target = module if section == _MODULE_SECTION and module is not None else sections[section]
        value, limits = _mlxlink_value(key, kv[1])
        if key in target:
            problems.add(f"{section}: {kv[0]} printed twice; the last is kept")
        target[key] = value
        if limits is not None:
            target[f"{key}_range"] = limits

    if module is None and not sections:
        reason = f"mlxlink printed no section, only: {errors[0]}" if errors else ""
        return unrecognised(
            MLXLINK, reason or "no mlxlink section (e.g. 'Module Info') found", errors=errors
        )
    if module is None:
        problems.add("no 'Module Info' section (mlxlink run without -m?)")
    elif not module:
        problems.add("'Module Info' section has no fields (truncated output?)")
        module = None
    data = {"module": module, "sections": sections, "errors": errors, "warnings": warnings}
    return ParseResult(MLXLINK, True, data, problems.result())
