"""Node basics that break jobs: the file systems a node must have (``df``) and its clock
(``clock``: ``date -u +%s.%N``, GNU date's seconds since the epoch with nanoseconds, one line;
data ``{epoch}``, a float; anything else, BSD or busybox date's literal ``N`` included, is not
recognised).

One kind, ``df``: GNU df with the columns gpuctl asks for,
``df -B1 --output=file,target,fstype,size,avail -- PATH...``: per path asked for, the mount
point that holds it (a path that is no mount of its own shows its parent's), the file system
type, its size and the space free for unprivileged users, in bytes. A path df cannot stat has
no row (df says so on stderr and exits 1). The header line is skipped whatever its language;
every other line must be a row of exactly these columns.

Data::

    filesystems: [{file, target, fstype, size_bytes, avail_bytes}]   one per row, in order

What the judges read of it: :func:`filesystems_of` (a :class:`Filesystem` per row). The
``slurmd -C`` parser, the other half of the node basics, is in :mod:`.slurm`
(:func:`gpuctl.validation.parsers.slurm.slurmd_hardware_of`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import count_of, to_count, to_float, to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

DF = "df"
CLOCK = "clock"
MEMINFO = "meminfo"
# /proc/meminfo: "Name:   <number>[ kB]" (fs/proc/meminfo.c); names may hold "(" ")" and "_"
_MEMINFO = re.compile(r"([A-Za-z][A-Za-z0-9_()]{0,40}):\s+(\d{1,20})(?: kB)?")
# seconds since 1970 (9 to 11 digits: 2001 to 5138) and the nanoseconds GNU date prints
_EPOCH = re.compile(r"\d{9,11}\.\d{9}")

_BYTES = re.compile(r"\d{1,24}")


@parser(
    DF, description="df -B1 --output=file,target,fstype,size,avail: required mounts, free space"
)
def parse_df(text: str) -> ParseResult:
    lines = [line for line in clean(text).split("\n") if line.strip()]
    if not lines:
        return unrecognised(DF, "empty output (df printed no header)")
    header, rows = lines[0].split(), lines[1:]
    if len(header) < 5 or _BYTES.fullmatch(header[-1]) or header[0].startswith("/"):
        return unrecognised(DF, f"no df header line: {lines[0][:120]!r}")
    if header[0] == "Filesystem":
        return unrecognised(
            DF, "df's default columns (Filesystem ...): gpuctl reads --output=file,target,..."
        )
    filesystems: list[dict[str, Any]] = []
    problems: list[str] = []
    for line in rows:
        words = line.split()
        size = to_int(words[-2]) if len(words) >= 5 and _BYTES.fullmatch(words[-2]) else None
        avail = to_int(words[-1]) if len(words) >= 5 and _BYTES.fullmatch(words[-1]) else None
        if size is None or avail is None or not words[0].startswith("/"):
            problems.append(f"not a row of file, mount point, type, size, free: {line[:120]!r}")
            continue
        filesystems.append(
            {
                "file": words[0],
                # a mount point with a blank in it keeps its blanks (single ones)
                "target": " ".join(words[1:-3]),
                "fstype": words[-3],
                "size_bytes": size,
                "avail_bytes": avail,
            }
        )
    if not filesystems and problems:
        return unrecognised(DF, problems[0])
    return ParseResult(DF, True, {"filesystems": filesystems}, tuple(problems))


@parser(CLOCK, description="date -u +%s.%N: the node's clock, seconds since the epoch")
def parse_clock(text: str) -> ParseResult:
    lines = [line.strip() for line in clean(text).split("\n") if line.strip()]
    if len(lines) != 1 or not _EPOCH.fullmatch(lines[0]):
        shown = lines[0][:60] if lines else ""
        return unrecognised(
            CLOCK, f"expected one line SECONDS.NANOSECONDS (GNU date), got {shown!r}"
        )
    epoch = to_float(lines[0])  # 18 to 20 digits (_EPOCH): always read
    if epoch is None:
        return unrecognised(CLOCK, f"not a number of seconds: {lines[0][:60]!r}")
    return ParseResult(CLOCK, True, {"epoch": epoch}, ())


@parser(MEMINFO, description="/proc/meminfo: memory and the hugepage pool")
def parse_meminfo(text: str) -> ParseResult:
    values: dict[str, int] = {}
    problems: list[str] = []
    for line in clean(text).split("\n"):
        if not line.strip():
            continue
        m = _MEMINFO.fullmatch(line.strip())
        if m is None:
            problems.append(f"not a meminfo line: {line.strip()[:80]!r}")
            continue
        count = to_count(m.group(2))
        if count is not None:  # at most 20 digits (_MEMINFO), so always
            values[m.group(1)] = count
    if "MemTotal" not in values:
        return unrecognised(MEMINFO, "no MemTotal line: not /proc/meminfo")
    return ParseResult(MEMINFO, True, {"values": values}, tuple(problems))


@dataclass(frozen=True, slots=True)
class Filesystem:
    """One row of df: the path asked for, the mount point holding it, type, size, free bytes
    (None: not shown)."""

    file: str
    target: str | None
    fstype: str | None
    size_bytes: int | None
    avail_bytes: int | None


def filesystems_of(data: Mapping[str, Any]) -> list[Filesystem]:
    """The rows of :func:`parse_df`'s data."""
    out: list[Filesystem] = []
    for row in data.get("filesystems") or []:
        if not isinstance(row, Mapping) or not isinstance(row.get("file"), str):
            continue
        out.append(
            Filesystem(
                file=row["file"],
                target=_text(row.get("target")),
                fstype=_text(row.get("fstype")),
                size_bytes=count_of(row.get("size_bytes")),
                avail_bytes=count_of(row.get("avail_bytes")),
            )
        )
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
