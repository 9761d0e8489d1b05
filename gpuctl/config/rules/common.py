"""Helpers every area's rules use: duplicates, folded node names, the names a reference may take."""

from __future__ import annotations

from collections.abc import Iterable

from gpuctl.config.findings import Loc, loc_to_str

SHOWN = 5  # names quoted in one message; the rest are counted


def dupes(items: Iterable[tuple[str, Loc]], what: str, out: list[tuple[Loc, str]]) -> None:
    seen: dict[str, Loc] = {}
    for value, loc in items:
        if value in seen:
            out.append((loc, f"{what} {value!r} is already used at {loc_to_str(seen[value])}"))
        else:
            seen[value] = loc


def fold(names: Iterable[str]) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(list(names)))


def choices(names: Iterable[str]) -> str:
    names = sorted(names)
    return f"; defined: {', '.join(names)}" if names else "; none is defined"
