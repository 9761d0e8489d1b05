"""``rdma statistic show link <dev>/<port>`` (iproute2's rdma tool): an RDMA port's counters,
the kernel's hw_counters of a RoCE port (out_of_sequence, local_ack_timeout_err, ...).

Layouts (tests/fixtures/ib/counters/rdma-statistic-*.txt): one line per port, name and value
pairs after ``link <dev>/<port>``::

    link mlx5_0/1 rx_write_requests 0 rx_read_requests 0 ... out_of_sequence 0 ...

or with ``-p`` (pretty) one pair per indented line under the ``link`` line. Both are read as
one stream of words: ``link`` and ``<dev>/<port>`` start a port, then name/value pairs. (A
mail that wraps the one-line layout at any column reads the same.)

Data (docs/parse.md)::

    links: [{device, port, counters: {name: int | null}}]

A value that is not a whole number is null, with a problem; a name twice in one port is a
problem. What the judges read of it: :func:`link_counters_of`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import to_count, to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND = "rdma-stat"
_LINK = re.compile(r"([A-Za-z0-9_.:-]{1,64})/(\d{1,3})")
_NAME = re.compile(r"[a-z][a-z0-9_]{0,80}")


@parser(KIND, description="rdma statistic show link: an RDMA port's hw counters (RoCE)")
def parse_rdma_stat(text: str) -> ParseResult:
    words = clean(text).split()
    if not words:
        return unrecognised(KIND, "empty input")
    if words[0] != "link" or len(words) < 2 or not _LINK.fullmatch(words[1]):
        return unrecognised(KIND, f"no 'link <device>/<port>' first: {' '.join(words[:8])[:120]!r}")
    problems: list[str] = []
    links: list[dict[str, Any]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "link" and i + 1 < len(words) and (m := _LINK.fullmatch(words[i + 1])):
            links.append({"device": m.group(1), "port": to_int(m.group(2)), "counters": {}})
            i += 2
            continue
        where = f"{links[-1]['device']}/{links[-1]['port']}"
        if not _NAME.fullmatch(word) or i + 1 >= len(words):
            problems.append(f"{where}: unexpected {word[:60]!r}")
            i += 1
            continue
        value = words[i + 1]
        count = to_count(value)
        if count is None:
            problems.append(f"{where}: {word}: not a count: {value[:40]!r}")
        counters = links[-1]["counters"]
        if word in counters:
            problems.append(f"{where}: {word} appears twice")
        counters[word] = count
        i += 2
    for link in links:
        if not link["counters"]:
            problems.append(f"{link['device']}/{link['port']}: no counters")
    return ParseResult(KIND, True, {"links": links}, tuple(problems))


@dataclass(frozen=True, slots=True)
class LinkCounters:
    """One port: its device and port number, name -> count (None: not a number)."""

    device: str
    port: int | None
    counts: Mapping[str, int | None]


def link_counters_of(data: Mapping[str, Any]) -> tuple[LinkCounters, ...]:
    """The records of :func:`parse_rdma_stat`'s data."""
    out = []
    for link in data.get("links") or ():
        counters = link.get("counters") or {}
        port = link.get("port")
        out.append(
            LinkCounters(
                device=str(link.get("device") or ""),
                port=port if isinstance(port, int) else None,
                counts={str(k): v if isinstance(v, int) else None for k, v in counters.items()},
            )
        )
    return tuple(out)
