"""What ``nvidia-smi -q`` and ``-q -x`` have in common: the tree both are read into
(:class:`Node`, keys normalised to ``snake_case``), the placeholders and read-failure words
nvidia-smi prints instead of a value, its error banners, and the readers of one value.

Used by :mod:`gpuctl.validation.parsers.nvsmi_gpu` (the extractor),
:mod:`gpuctl.validation.parsers.nvsmi_query` (``smi-q``, ``smi-xml``) and
:mod:`gpuctl.validation.parsers.nvsmi_csv` (``smi-csv``). No parser is registered here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter

from gpuctl.validation.numbers import number

# Values nvidia-smi prints when it has nothing to show: they become None.
PLACEHOLDERS = frozenset(
    {
        "n/a",
        "[n/a]",
        "not supported",
        "[not supported]",
        "requested functionality has been deprecated",
        "[requested functionality has been deprecated]",
        "insufficient permissions",
        "[insufficient permissions]",
        "not available",
        "[not available]",
    }
)
# Values that say the read failed: None in data, listed in the GPU's read_errors, and a problem
# where the field matters for health (see nvsmi_gpu._HEALTH_PATHS).
ERROR_VALUES = frozenset(
    {
        "unknown error",
        "[unknown error]",
        "err!",
        "[err!]",
        "gpu is lost",
        "[gpu is lost]",
        "gpu requires reset",
        "[gpu requires reset]",
    }
)
_ERROR_BANNERS = (
    re.compile(r"NVIDIA-SMI has failed", re.IGNORECASE),
    re.compile(r"No devices were found", re.IGNORECASE),
    re.compile(r"Failed to initialize NVML", re.IGNORECASE),
    re.compile(r"Unable to determine the device handle", re.IGNORECASE),
    re.compile(r"couldn't communicate with the NVIDIA driver", re.IGNORECASE),
    re.compile(r"^Field \".*\" is not a valid field to query", re.IGNORECASE),
    re.compile(r"^Invalid combination of input arguments", re.IGNORECASE),
)
NUM_UNIT = re.compile(r"([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%/()]*)")


# Real -q / -q -x output nests 6 levels deep; deeper input is refused line by line (it would
# otherwise recurse without bound). Over-long numbers are refused by gpuctl.validation.numbers.
MAX_DEPTH = 24


_ANY_ERROR_BANNER = re.compile("|".join(f"(?:{p.pattern})" for p in _ERROR_BANNERS), re.IGNORECASE)


_BANNER_WORDS = (
    "failed",
    "no devices",
    "unable to determine",
    "communicate",
    "not a valid field",
    "invalid combination",
)


def may_have_banner(text: str) -> bool:
    """Whether ``text`` (a whole output or one line), lower-cased, holds one of the banner
    words: a cheap test before the regex search (most outputs have no banner)."""
    low = text.lower()
    for word in _BANNER_WORDS:  # noqa: SIM110 - a loop: no generator for each new line
        if word in low:
            return True
    return False


def is_error_banner(line: str) -> bool:
    # Each banner holds one of _BANNER_WORDS, and on ASCII text ignoring case is lower():
    # an ASCII line without one of them is no banner (most lines; the search costs more).
    if line.isascii() and not may_have_banner(line):
        return False
    return _ANY_ERROR_BANNER.search(line) is not None  # one pass instead of one per banner


# ------------------------------------------------------------------------------------------
# The tree both smi-q and smi-xml are read into


@dataclass(slots=True)
class Node:
    key: str  # normalised: lower case, runs of other characters -> "_"
    label: str  # as printed (text label or XML tag)
    value: str | None  # stripped; None for a section header
    # a list; leaves of the -q text tree share one empty tuple (an object fewer per line)
    children: Sequence[Node] = ()
    attrs: dict[str, str] | None = None  # XML attributes (text lines have none)
    # children by key (the first of each), built on the first look-up of a large section and
    # rebuilt when children were added since: (child count when built, index)
    _index: tuple[int, dict[str, Node]] | None = field(default=None, repr=False, compare=False)

    def child(self, key: str) -> Node | None:
        """The first child with ``key``."""
        children = self.children
        if len(children) < _INDEXED:
            for c in children:
                if c.key == key:
                    return c
            return None
        # a GPU section has ~60 children, each read by key: index them once
        index = self._index
        if index is None or index[0] != len(children):
            # built from the last child to the first: the first of each key is the one kept
            first = dict(zip(map(_KEY_OF, reversed(children)), reversed(children), strict=True))
            index = self._index = (len(children), first)
        return index[1].get(key)

    def find(self, path: Sequence[str]) -> Node | None:
        node: Node | None = self
        for key in path:
            if node is None:
                return None
            node = node.child(key)
        return node

    def walk(self) -> Iterable[tuple[str, Node]]:
        """Every descendant with its path of labels ("ECC Errors/Volatile/...")."""
        for c in self.children:
            yield c.label, c
            if c.children:  # (a leaf's walk yields nothing)
                for sub, node in c.walk():
                    yield f"{c.label}/{sub}", node


_INDEXED = 12  # sections with fewer children are searched in order
_KEY_OF = attrgetter("key")


class Leaf(Node):
    """A node without children that cannot change: one object can stand for a line in every
    tree it is read into (nvsmi_query keeps one per -q line read before)."""

    __slots__ = ()

    def __init__(self, key: str, label: str, value: str | None) -> None:
        init = object.__setattr__  # (Node's __init__ would call __setattr__ below)
        init(self, "key", key)
        init(self, "label", label)
        init(self, "value", value)
        init(self, "children", ())
        init(self, "attrs", None)
        init(self, "_index", None)  # child() sets it only where there are 12 children or more

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Leaf cannot change: {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a Leaf cannot change: {name}")


_NON_ALNUM = re.compile(r"[^a-z0-9]+")


@lru_cache(maxsize=4096)
def norm_key(label: str) -> str:
    return _NON_ALNUM.sub("_", label.strip().lower()).strip("_")


Path = tuple[str, ...]


def read_raw(node: Node | None, *paths: Path) -> str | None:
    """The value of the first path that exists with a value (as printed), else None."""
    if node is None:
        return None
    for path in paths:  # node.find(path), without a call per path
        hit = node
        for key in path:
            below = hit.child(key)
            if below is None:
                break
            hit = below
        else:
            if hit.value is not None:
                return hit.value
    return None


def find_section(node: Node | None, *paths: Path) -> Node | None:
    if node is None:
        return None
    for path in paths:  # node.find(path), without a call per path
        hit = node
        for key in path:
            below = hit.child(key)
            if below is None:
                break
            hit = below
        else:
            return hit
    return None


# A note nvidia-smi puts after a value it will stop printing (610 and later):
# ``610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]``.
_DEPRECATION_NOTE = re.compile(r"\[\s*deprecated\b[^\[\]]*\]", re.IGNORECASE)


def strip_note(value: str) -> str:
    """The value without a trailing deprecation note (the value itself, never the note; a
    note alone stays as it is). Linear: one look at the text after the last ``[``."""
    value = value.strip()
    if not value.endswith("]"):
        return value  # the common case
    at = value.rfind("[")
    head = value[:at].rstrip()
    return head if head and _DEPRECATION_NOTE.fullmatch(value, at) else value


def _placeholder(value: str | None) -> bool:
    if value is None:
        return True
    low = strip_note(value).lower()
    return low == "" or low in PLACEHOLDERS or low in ERROR_VALUES


def read_text(value: str | None) -> str | None:
    """The value without a deprecation note; None for a placeholder (:func:`_placeholder`)."""
    if value is None:
        return None
    if len(value) <= _CACHED_VALUE:
        return _read_text(value)
    return _read_text_uncached(value)


@lru_cache(maxsize=32768)
def _read_text(value: str) -> str | None:
    return _read_text_uncached(value)


def _read_text_uncached(value: str) -> str | None:
    text = strip_note(value)
    low = text.lower()
    return None if low == "" or low in PLACEHOLDERS or low in ERROR_VALUES else text


def read_num(value: str | None) -> int | float | None:
    """``"143771 MiB"`` -> 143771, ``"16x"`` -> 16, ``"-8 C"`` -> -8; placeholders -> None.
    A deprecation note after the value is dropped (``"250.00 W [Deprecated ...]"`` -> 250.0)."""
    if value is not None and len(value) <= _CACHED_VALUE:
        return _read_num(value)
    return _read_num_uncached(value)


_CACHED_VALUE = 80  # values of a fleet repeat: the short ones are read once


@lru_cache(maxsize=32768)
def _read_num(value: str) -> int | float | None:
    return _read_num_uncached(value)


def _read_num_uncached(value: str | None) -> int | float | None:
    if _placeholder(value):
        return None
    m = NUM_UNIT.fullmatch(strip_note(value or ""))
    return number(m.group(1)) if m else None


def read_int(value: str | None) -> int | None:
    n = _read_num(value) if value is not None and len(value) <= _CACHED_VALUE else read_num(value)
    return n if isinstance(n, int) else None


def read_yes_no(value: str | None) -> bool | None:
    low = (value or "").strip().lower()
    if low in ("yes", "true", "enabled"):
        return True
    if low in ("no", "false", "disabled"):
        return False
    return None


def read_active(value: str | None) -> bool | None:
    low = (value or "").strip().lower()
    if low == "active":
        return True
    if low == "not active":
        return False
    return None
