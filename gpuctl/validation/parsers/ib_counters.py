"""``perfquery``: an InfiniBand port's counters (infiniband-diags).

Both layouts (tests/fixtures/ib/counters/perfquery-*.txt)::

    # Port counters: Lid 1 port 1 (CapMask: 0x5A00)                          (perfquery -C)
    # Port extended counters: Lid 2052 port 1 (CapMask: 0x5300 CapMask2: ...) (perfquery -x)
    PortSelect:......................1
    SymbolErrorCounter:..............0
    LinkDownedCounter:...............1
    ...

One block per header (``perfquery -x`` of two ports prints two). The plain layout's error
counters are the IBTA PortCounters (SymbolErrorCounter 16 bits, LinkDownedCounter 8 bits, ...),
the data counters 32 bits; the extended layout's data counters 64 bits.

Data (docs/parse.md)::

    blocks: [{lid, port, extended, counters: {name: int | null}}]

``CounterSelect`` and ``CounterSelect2`` (masks, hex) and ``PortSelect`` are not counters and
are left out. A value that is not a whole number is null, with a problem. What the judges read
of it: :func:`port_counters_of` (a tuple of :class:`PortCounters`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import to_count, to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND = "perfquery"
_HEADER = re.compile(
    r"#\s*Port\s+(extended\s+)?counters:\s*Lid\s+(\d+)\s+port\s+(\d+)(?:\s*\(.*\))?", re.IGNORECASE
)
_FIELD = re.compile(r"([A-Za-z][A-Za-z0-9]{1,60}):\.*\s*(\S+)")
_NOT_COUNTERS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})


# Ports print the same short counts (mostly 0): their reading is remembered (bounded)
_SHORT = 40
_short_count = functools.lru_cache(maxsize=4096)(to_count)


@parser(KIND, description="perfquery [-x]: an InfiniBand port's error and data counters")
def parse_perfquery(text: str) -> ParseResult:
    lines = [stripped for line in clean(text).split("\n") if (stripped := line.strip())]
    if not lines:
        return unrecognised(KIND, "empty input")
    problems: list[str] = []
    blocks: list[dict[str, Any]] = []
    for line in lines:
        # a header starts with "#", a field with a letter: one pattern can match
        if line[0] == "#":
            head, field = _HEADER.fullmatch(line), None
        else:
            head, field = None, _FIELD.fullmatch(line)
        if head:
            blocks.append(
                {
                    "lid": to_int(head.group(2)),
                    "port": to_int(head.group(3)),
                    "extended": head.group(1) is not None,
                    "counters": {},
                }
            )
        elif field and blocks:
            name, value = field.group(1), field.group(2)
            if name in _NOT_COUNTERS:
                continue
            count = _short_count(value) if len(value) <= _SHORT else to_count(value)
            if count is None:
                problems.append(f"port {blocks[-1]['port']}: {name}: not a count: {value[:40]!r}")
            if name in blocks[-1]["counters"]:
                problems.append(f"port {blocks[-1]['port']}: {name} appears twice")
            blocks[-1]["counters"][name] = count
        else:
            problems.append(f"unexpected line: {line[:120]!r}")
    if not blocks:
        return unrecognised(KIND, f"no '# Port counters:' header; first line: {lines[0][:120]!r}")
    for block in blocks:
        if not block["counters"]:
            problems.append(f"port {block['port']}: a header without counters")
    return ParseResult(KIND, True, {"blocks": blocks}, tuple(problems))


@dataclass(frozen=True, slots=True)
class PortCounters:
    """One block: the port and LID as printed, whether 64-bit (``-x``), name -> count (None:
    not a number)."""

    lid: int | None
    port: int | None
    extended: bool
    counts: Mapping[str, int | None]


def port_counters_of(data: Mapping[str, Any]) -> tuple[PortCounters, ...]:
    """The records of :func:`parse_perfquery`'s data."""
    out = []
    for block in data.get("blocks") or ():
        counters = block.get("counters") or {}
        out.append(
            PortCounters(
                lid=block.get("lid"),
                port=block.get("port"),
                extended=block.get("extended") is True,
                counts={str(k): v if isinstance(v, int) else None for k, v in counters.items()},
            )
        )
    return tuple(out)
