"""Node sets (ClusterShell notation, ``gpu[001-064]``): bounded before expansion, expanded once.

A node set is checked on its brackets (:func:`estimated_size`) before ClusterShell expands it, so
a typo that names millions of hosts is one error line, not minutes of work.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError

# Most names one node set may expand to. A typo such as `gpu[1-100]-[1-100]-[1-1000]` (ten
# million names) must be refused before it is expanded, or `gpuctl check` hangs.
MAX_NODESET = 100_000
# Most nodes of one cluster.yml, all groups together (docs/cluster-yml.md): checked on the
# node sets' brackets before anything is expanded.
MAX_CLUSTER_NODES = 100_000

_BRACKETS = re.compile(r"\[([^\]]*)\]")


def top_level_pieces(text: str, separators: str = ",!&^") -> list[str]:
    """``text`` cut at ``separators`` (the set operators) outside brackets, in one linear pass."""
    pieces: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif depth == 0 and ch in separators:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    return pieces


def estimated_size(text: str) -> int:
    """Upper bound of the names a node set expands to, from its brackets, without expanding it."""
    total = 0
    for piece in top_level_pieces(text):
        size = 1
        for inner in _BRACKETS.findall(piece):
            count = 0
            for part in inner.split(","):
                m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*(?:/\s*(\d+))?\s*", part)
                if m:
                    lo, hi, step = int(m[1]), int(m[2]), int(m[3] or 1)
                    count += max(0, hi - lo) // max(step, 1) + 1
                else:
                    count += 1
            size *= max(count, 1)
        total += size
    return total


def nodeset_value(value: Any) -> Any:
    """The before-validator of a node set field: refused before expansion when too big."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        raise ValueError("empty node set")
    if "@" in text:
        raise ValueError(
            f"{value!r}: ClusterShell @group names depend on the machine gpuctl runs on; "
            "write the names out (gpu[001-064])"
        )
    estimate = estimated_size(text)
    if estimate > MAX_NODESET:
        raise ValueError(f"expands to {estimate} names; gpuctl handles at most {MAX_NODESET}")
    try:
        nodes = NodeSet(text, resolver=RESOLVER_NOGROUP)
    except (NodeSetParseError, ValueError) as exc:
        raise ValueError(f"not a valid node set {value!r}: {exc}") from None
    if len(nodes) == 0:
        raise ValueError(f"node set {value!r} names no node")
    return text


def expand(nodeset: str) -> list[str]:
    """Expand a node set string, keeping ClusterShell's order (sorted, numeric-aware)."""
    return list(_expand(nodeset))


def expand_in_order(nodeset: str) -> list[str]:
    """Expand a node set piece by piece, in the order written: ``b1,a[1-2]`` -> b1, a1, a2.

    Used for addresses, which pair with the (sorted) node names position by position.
    """
    return list(_expand_in_order(nodeset))


@cache
def _expand(nodeset: str) -> tuple[str, ...]:
    return tuple(NodeSet(nodeset))


@cache
def _expand_in_order(nodeset: str) -> tuple[str, ...]:
    out: list[str] = []
    for piece in top_level_pieces(nodeset, ","):
        piece = piece.strip()
        if not piece:
            continue
        if "[" in piece:
            out.extend(NodeSet(piece))
        else:
            out.append(piece)
    return tuple(out)
