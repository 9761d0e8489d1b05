"""Numbers read from tool output: the one place where text becomes an ``int`` or a ``float``.

Parsers (``gpuctl.validation.parsers``, the rollout tool parsers) never call ``int()``,
``float()`` or ``json.loads`` on what a tool printed; they call these helpers, which refuse
(return None: the field is unknown, never 0) what no tool prints:

* a digit string of more than :data:`MAX_DIGITS` digits. ``int()`` raises ValueError past
  4,300 digits (one node's output would abort a whole validation), and no counter of any tool
  has more than 20; the length is checked before anything is converted;
* a float that is not finite (``nan``, ``inf``, ``1e400`` which ``float()`` turns into inf),
  that underflows to 0 (``1e-400``), or whose size reaches ``10**MAX_DIGITS`` (``1e308``: finite,
  but a judge's unit conversion would turn it into inf);
* text that is not a plain ASCII decimal number (``N/A``, ``12abc``, ``1,5``, other scripts'
  digits).

So every number a parser returns is finite and smaller than :data:`LIMIT` in size, and any
arithmetic a judge does with a few of them stays finite.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, TypeVar

MAX_DIGITS = 30
LIMIT = 10**MAX_DIGITS
_MAX_TEXT = 64  # longer text is refused before any pattern looks at it
_MAX_EXPONENT_DIGITS = 4

_SIGN = r"[-+]?"
_INT = re.compile(rf"{_SIGN}([0-9]+)", re.ASCII)
_HEX = re.compile(r"0[xX]([0-9A-Fa-f]+)", re.ASCII)
_FLOAT = re.compile(
    rf"{_SIGN}(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?:[eE](?P<exp>{_SIGN}[0-9]+))?", re.ASCII
)
# What a number that was refused looks like: digits (any count), a decimal point, an exponent,
# or a non-finite word; used where a parser would otherwise keep the cell as text.
_NUMERIC_SHAPE = re.compile(
    rf"\s*{_SIGN}(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]{_SIGN}[0-9]+)?\s*"
    rf"|\s*{_SIGN}(?:nan|inf|infinity)\s*",
    re.ASCII | re.IGNORECASE,
)

_N = TypeVar("_N", int, float)


def to_count(text: str | None) -> int | None:
    """A counter as tools print it: digits only (``"20046"``), no sign, at most
    :data:`MAX_DIGITS` digits; None for anything else (``N/A``, ``-1``, ``0x1f``)."""
    if text is None or not text.isascii() or not text.isdigit():
        return None
    return to_int(text)


def count_of(value: Any, *, least: int = 0) -> int | None:
    """A count a parser already read (an int, never a bool) of at least ``least``; else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= least:
        return value
    return None


def to_int(text: str | None, *, hex_prefix: bool = False) -> int | None:
    """``"400"`` -> 400, ``"-8"`` -> -8 (``hex_prefix``: also ``"0x1f"`` -> 31); None for
    anything else, and for more than :data:`MAX_DIGITS` digits."""
    if text is None:
        return None
    text = text.strip()
    if len(text) > _MAX_TEXT:
        return None
    m = _INT.fullmatch(text)
    if m is not None:
        return int(text) if len(m.group(1)) <= MAX_DIGITS else None
    if hex_prefix:
        h = _HEX.fullmatch(text)
        if h is not None and len(h.group(1)) <= MAX_DIGITS:
            return int(h.group(1), 16)
    return None


def to_float(text: str | None) -> float | None:
    """``"23.5"``, ``"400"``, ``"2.38e-07"`` as a float; None for non-finite, underflowing,
    over-long or implausibly large values and for anything that is not a decimal number."""
    if text is None:
        return None
    text = text.strip()
    if len(text) > _MAX_TEXT:
        return None
    m = _FLOAT.fullmatch(text)
    if m is None:
        return None
    whole, frac, exp = m.group("int"), m.group("frac") or "", m.group("exp")
    digits = whole + frac
    if not digits or len(digits) > MAX_DIGITS:
        return None
    if exp is not None and len(exp.lstrip("+-")) > _MAX_EXPONENT_DIGITS:
        return None
    value = float(text)
    if value == 0.0 and digits.strip("0"):
        return None  # 1e-400: the text says non-zero, the float says 0
    return plausible(value + 0.0)  # + 0.0 turns -0.0 into 0.0


def number(text: str | None) -> int | float | None:
    """``"400"`` -> 400, ``"23.5"`` -> 23.5; ``N/A``, ``[N/A]``, ``""``, ``nan``, ``inf``,
    ``1e400``, 5,000 digits -> None."""
    if text is None:
        return None
    if len(text) <= _CACHED_TEXT:
        return _number(text)
    value = to_int(text)
    return value if value is not None else to_float(text)


# Outputs of a fleet repeat the same few thousand short numbers ("0", "80", "N/A"): the
# conversion of a short text is remembered (a pure function of its text).
_CACHED_TEXT = 40


@functools.lru_cache(maxsize=32768)
def _number(text: str) -> int | float | None:
    value = to_int(text)
    return value if value is not None else to_float(text)


def plausible(value: _N) -> _N | None:
    """A number gpuctl computed from parsed ones (a sum, seconds from days): None when it is not
    finite or its size reaches :data:`LIMIT`."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if abs(value) < LIMIT else None


def looks_numeric(text: str | None) -> bool:
    """True when ``text`` has the shape of a number (or is ``nan``/``inf``) whatever its size:
    a cell a parser must report unreadable when :func:`number` refuses it, not keep as text."""
    return text is not None and _NUMERIC_SHAPE.fullmatch(text) is not None


# ------------------------------------------------------------------------------------------
# JSON


def _json_constant(_name: str) -> None:
    return None  # NaN, Infinity, -Infinity: unknown


# Integers, floats and the constants of a JSON document through the helpers above: a field
# holding 5,000 digits, 1e400 or NaN decodes as None (unknown), the rest of the document stays.
_DECODER = json.JSONDecoder(parse_int=to_int, parse_float=to_float, parse_constant=_json_constant)


def json_loads(text: str) -> Any:
    """``json.loads`` with every number through :func:`to_int` / :func:`to_float`; raises
    json.JSONDecodeError (a ValueError) for invalid JSON and for a document nested too deep."""
    value, end = json_raw_decode(text)
    if text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def json_raw_decode(text: str) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode`` (a document followed by other text) with the number
    rules of :func:`json_loads`; leading white space is skipped."""
    start = len(text) - len(text.lstrip())
    try:
        value, end = _DECODER.raw_decode(text, start)
    except RecursionError:
        raise json.JSONDecodeError("document nested too deep", text, start) from None
    return value, end


def implausible_numbers(value: Any, where: str = "data") -> list[str]:
    """Where a parsed structure breaks the contract of this module: every non-finite number,
    and every one of :data:`LIMIT` or more in size, dict keys included (for tests and audits of
    parser results)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, float):
        if not math.isfinite(value):
            return [f"{where}: {value!r}"]
        return [f"{where}: {value!r} (>= 1e{MAX_DIGITS})"] if abs(value) >= LIMIT else []
    if isinstance(value, int):
        return [f"{where}: {len(str(abs(value)))}-digit integer"] if abs(value) >= LIMIT else []
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            out += implausible_numbers(key, f"{where} key {str(key)[:20]!r}")
            out += implausible_numbers(item, f"{where}.{str(key)[:40]}")
    elif isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            out += implausible_numbers(item, f"{where}[{i}]")
    return out
