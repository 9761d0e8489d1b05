"""Plausibility: whether a number can have come from the hardware at all.

The judges hold measurements to thresholds; before that, this module says whether a value is a
finite number and below the physical ceiling of its link or GPU (:mod:`gpuctl.config.catalog`,
data/limits.yml), whether a tool's table holds rows the parser could not read, and which items
of a listing repeat an earlier one (the same GPU twice). A value that fails here was printed by
a broken tool or a stand-in, never measured.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuctl.config.catalog import Ceiling, ceiling_tolerance

_FLOAT_MAX = int(sys.float_info.max)
_FLOAT_MAX_F = sys.float_info.max


def finite(value: Any) -> float | None:
    """A finite number as a float; None for anything else (text, None, NaN, infinity, an
    integer too large for a float)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int:
        return float(value) if -_FLOAT_MAX <= value <= _FLOAT_MAX else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def not_finite(value: Any) -> bool:
    """A number that cannot be judged or written to JSON: NaN, infinity, a huge integer."""
    kind = type(value)
    if kind is float:
        return not math.isfinite(value)
    if kind is int:
        return not -_FLOAT_MAX <= value <= _FLOAT_MAX
    if value is None or kind is str or isinstance(value, bool):
        return False
    return isinstance(value, int | float) and finite(value) is None


def show_number(value: Any) -> str:
    """A number for a message, whatever its size."""
    if isinstance(value, int) and not isinstance(value, bool) and finite(value) is None:
        return f"a {value.bit_length()}-bit integer"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{float(value):g}"
    return repr(value)


def implausible(value: Any, ceiling: Ceiling | None, what: str, unit: str) -> str | None:
    """Why a measured ``value`` cannot have come from the hardware, or None when it can.

    Not a number, NaN or infinity: "not a finite number" (None means the tool's output held no
    number where one belongs). Above ``ceiling`` plus the tolerance in data/limits.yml, or
    below zero: the tool, or whatever stands in for it, is lying."""
    number = finite(value)
    huge = isinstance(value, int) and not isinstance(value, bool) and number is None
    if number is None and not huge:
        shown = "" if value is None else f" ({show_number(value)})"
        return f"{what}{shown} is not a finite number"
    if number is not None and number < 0:
        return f"{what} {number:g} {unit} is below zero: no link carries that"
    if ceiling is None:
        return None
    tolerance = ceiling_tolerance()
    if huge or (number is not None and number > ceiling.value * (1.0 + tolerance)):
        return (
            f"{what} {show_number(value)} {unit} is above the physical limit of {ceiling.what}, "
            f"{ceiling.value:g} {unit} (+{tolerance:.0%}): the tool or a stand-in is lying"
        )
    return None


_ABSENT_IDS = frozenset({"", "n/a", "[n/a]", "none", "unknown", "not supported"})


def id_value(value: Any) -> Any:
    """A comparable identifier (UUID, bus id, GUID, minor number), or None where the output
    shows none."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    return None if text in _ABSENT_IDS else text


def first_seen(
    items: Sequence[Mapping[str, Any]], keys: Sequence[tuple[str, str, Callable[[Any], Any]]]
) -> dict[int, tuple[int, str, Any]]:
    """Positions of items that repeat an earlier item on any key ->
    (that item's position, the key's label, the value)."""
    seen: dict[tuple[str, Any], int] = {}
    repeats: dict[int, tuple[int, str, Any]] = {}
    for i, item in enumerate(items):
        for key, label, norm in keys:
            value = norm(item.get(key))
            if value is None:
                continue
            first = seen.setdefault((key, value), i)
            if first != i and i not in repeats:
                repeats[i] = (first, label, item.get(key))
    return repeats


# Result lines as the tools print them (size, count, then a word or a number), counted in the
# raw text: a line the parser could not read (a NaN, a number too large) is never silently
# replaced by another row. A prefixed line (srun's "0: ") is not counted: never a false alarm.
NCCL_LINE = re.compile(r"^[ \t]*\d+[ \t]+\d+[ \t]+[A-Za-z]\w*[ \t]", re.MULTILINE)
PERFTEST_LINE = re.compile(r"^[ \t]*\d+[ \t]+\d+[ \t]+\S", re.MULTILINE)
# The same lines found by the newline before them: a search for a literal start skips ahead
# where "^" is tried at every position (half the time). No part of a line pattern matches a
# newline, so these count the lines that start after a position, the first line apart.
_AFTER_NEWLINE = {
    NCCL_LINE: re.compile(r"\n[ \t]*\d+[ \t]+\d+[ \t]+[A-Za-z]\w*[ \t]"),
    PERFTEST_LINE: re.compile(r"\n[ \t]*\d+[ \t]+\d+[ \t]+\S"),
}


def unread_lines(text: str | None, pattern: re.Pattern[str], read: int, header: str) -> int:
    """How many result lines of ``text`` (from its column ``header`` on) the parser did not
    turn into rows."""
    if not text:
        return 0
    start = max(text.find(header), 0)
    after = _AFTER_NEWLINE.get(pattern)
    if after is None:
        found = len(pattern.findall(text, start))
    else:  # the lines after ``start``, and the one at it ("^" matches there at a line start)
        found = len(after.findall(text, start)) + (pattern.match(text, start) is not None)
    return max(0, found - read)


_SIDES = ("out_of_place", "in_place")


def nccl_table_lie(
    rows: Sequence[Mapping[str, Any]], ceiling: Ceiling | None, text: str | None = None
) -> str | None:
    """Why an nccl-tests table cannot be believed, or None: a busbw (either side, any row)
    that is not a finite number or is above ``ceiling``, or (given the output ``text``) a
    result line the parser could not read. No other row is judged in place of a bad one.
    Multi-node runs pass :func:`gpuctl.config.catalog.multinode_busbw_ceiling`."""
    busbws = [
        (row.get("size"), side, half.get("busbw"))
        for row in rows
        for side in _SIDES
        if isinstance(half := row.get(side), Mapping)
    ]
    return nccl_busbw_lie(busbws, len(rows), ceiling, text)


def nccl_busbw_lie(
    busbws: Sequence[tuple[Any, str, Any]],
    rows: int,
    ceiling: Ceiling | None,
    text: str | None = None,
) -> str | None:
    """:func:`nccl_table_lie` of a table given as the busbw of each side a row shows, in
    order, as (the row's size, "out_of_place" or "in_place", the busbw), and its number of
    ``rows``."""
    not_finite: list[str] = []
    above: tuple[Any, Any] | None = None
    top = ceiling.value * (1.0 + ceiling_tolerance()) if ceiling is not None else math.inf
    # a float from 0 to the ceiling (and finite: no more than the largest float) is none of
    # the cases below, told without finite()
    fine = min(top, _FLOAT_MAX_F) if top == top else _FLOAT_MAX_F
    for size, side, raw in busbws:
        if type(raw) is float and 0.0 <= raw <= fine:
            continue
        value = finite(raw)
        if value is None and not (isinstance(raw, int) and not isinstance(raw, bool)):
            not_finite.append(f"{size} B ({side.replace('_', '-')})")
        elif above is None and (value is None or value > top or value < 0):
            above = (raw, size)
    if not_finite:
        more = f" and {len(not_finite) - 3} more" if len(not_finite) > 3 else ""
        return (
            f"busbw at {', '.join(not_finite[:3])}{more} is not a finite number: nccl-tests "
            "(or what stands in for it) printed no usable bandwidth there, and no other row is "
            "judged in its place"
        )
    unread = unread_lines(text, NCCL_LINE, rows, "size")
    if unread:
        return (
            f"{unread} result line(s) of nccl-tests hold a number that is not a finite number "
            "(nan, inf, too large or unreadable); no other row is judged in their place"
        )
    if above is not None:
        why = implausible(above[0], ceiling, "busbw", "GB/s")
        return f"{why} (at {above[1]} B)" if why else None
    return None
