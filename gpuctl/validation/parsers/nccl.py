"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``alltoall_perf`` ...).

One parser, ``nccl``, for every nccl-tests binary: the per-size result table, the
``# Out of bounds values`` / ``# Avg bus bandwidth`` trailer, the ``#  Rank ...`` device list and
the header lines, in both table formats (older ``error`` column with the maximum float error,
newer ``#wrong`` column with a count of wrong elements, with or without ``root``), back to the
first nccl-tests layout (2017: ``bytes N type op time algbw busbw res`` with the time in ms,
``#   Rank  0 on <host> device ...`` without a Pid, the ``nThread`` line and the trailer without
a leading ``#``; nccl-tests@b188a15 src/common.cu). Launcher
prefixes (``srun -l``'s ``N: `` and Open MPI ``--tag-output``'s ``[1,0]<stdout>:``) are removed
first. Lines that are not nccl-tests output (``NCCL INFO`` debug lines, MPI chatter) are skipped.

Data shape (docs/parse.md)::

    test: str | None            # "all_reduce_perf" when the output names it, else None
    nccl_tests_version: str | None
    nccl_version: str | None    # from "NCCL version 2.16.2+cuda11.6"
    params: {n_thread, n_gpus, min_bytes, max_bytes, step, warmup_iters, iters, agg_iters,
             validation, graph} | None   # from the "# nThread ..." line
    ranks: [{rank, group, pid, host, device, busid, name}]
    rows: [{size, count, type, redop, root, out_of_place: SIDE, in_place: SIDE}]
        SIDE = {time_us, algbw, busbw, wrong, error}
    error_column: "wrong" | "error" | None
    out_of_bounds: int | None
    out_of_bounds_ok: bool | None
    avg_busbw: float | None     # GB/s, from "# Avg bus bandwidth"; never computed
    concluded: bool             # "# Collective test concluded" seen
    errors: [str]               # failure lines (verbatim, stripped)
    warnings: [str]             # "NCCL WARN" lines

What the judges read of it: :func:`nccl_run_of` (an :class:`NcclRun`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import looks_numeric, number, to_count, to_float
from gpuctl.validation.parsing import ParseResult, clean, parser

KIND = "nccl"

# srun -l ("0: ", "12: ") and Open MPI --tag-output ("[1,0]<stdout>:") prefixes
_PREFIX = re.compile(r"^\s*(?:\d+: |\[\d+,\d+\]<std(?:out|err)>:\s?)")
_TESTS_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded:\s*(\S+)")
_NTHREAD = re.compile(r"^#\s*nThread\s+\d+")
# Lines the first nccl-tests layout (2017) printed without the leading "#" of later versions.
_UNMARKED = re.compile(
    r"(?:nThread\s+\d+\s+nGpus\b|Out of bounds values\s*:|Avg bus bandwidth\s*:|Using devices$)"
)
_NCCL_VERSION = re.compile(r"\bNCCL version\s+(\S+)")
_RANK = re.compile(  # Pid since nccl-tests 2019 (NCCL 2.4), Group since 2022 (2.13)
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?(?:Pid\s+(\d+)\s+)?on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\S+)\s*(OK|FAILED)?", re.IGNORECASE)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S*)")
_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_PLACEHOLDER = re.compile(r"^\{[^{}]*\}$")
_BINARY = re.compile(
    r"(?<![A-Za-z0-9])((?:all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|"
    r"sendrecv|scatter|gather|hypercube)_perf)(?![A-Za-z0-9])"
)
_PARAMS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("n_thread", re.compile(r"\bnThread\s+(\S+)")),
    ("n_gpus", re.compile(r"\bnGpus\s+(\S+)")),
    ("min_bytes", re.compile(r"\bminBytes\s+(\S+)")),
    ("max_bytes", re.compile(r"\bmaxBytes\s+(\S+)")),
    ("step", re.compile(r"\bstep:\s*(\S+)")),
    ("warmup_iters", re.compile(r"\bwarmup iters:\s*(\S+)")),
    ("iters", re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\S+)")),
    ("agg_iters", re.compile(r"\bagg iters:\s*(\S+)")),
    ("validation", re.compile(r"\bvalidation:\s*(\S+)")),
    ("graph", re.compile(r"\bgraph:\s*(\S+)")),
)
_FAILURES = re.compile(
    r"Test NCCL failure|Test CUDA failure|\bTest failure\b|NCCL ERROR|"
    r"There are not enough slots available|mpirun noticed that process|MPI_ABORT was invoked|"
    r"exited on signal|Segmentation fault|Bus error|srun: error|"
    r"error while loading shared libraries|ORTE has lost communication|"
    r"mpirun was unable to|Primary job\s+terminated normally, but",
    re.IGNORECASE,
)
# Lower-case text one of which every match of _FAILURES holds: an ASCII line without any is no
# failure line, and the slow case-insensitive pattern is searched only where one is found (in
# other text case folding differs: U+017F, the long s, matches "s": the pattern is searched).
_FAILURE_HINT = re.compile(
    r"failure|nccl error|not enough slots|mpirun|mpi_abort|exited on signal|segmentation fault|"
    r"bus error|srun: error|error while loading|orte has lost|primary job"
)
_WARN = re.compile(r"\bNCCL WARN\b")
_INFO = re.compile(r"^\S+:\d+:\d+ \[\d+\] NCCL INFO\b")


# What a result cell reads as: number()'s value, or _REFUSED where the cell looks like a number
# that number() refused (nan, inf, 1e400, 5,000 digits). _REFUSED is a NaN, which number() never
# returns; it is told apart by identity and never stored (the row gets None there).
_REFUSED = math.nan


def _cell(text: str) -> int | float | None:
    value = number(text)
    return _REFUSED if value is None and looks_numeric(text) else value


# A fleet's tables repeat the same short cells ("0.00", "N/A", the sizes): what one reads as is
# remembered (pure functions of the text); a long cell is not.
_SHORT = 40
_short_cell = functools.lru_cache(maxsize=16384)(_cell)
_short_number = functools.lru_cache(maxsize=4096)(number)


def _column(cell: str, value: int | float | None) -> str | None:
    """The error column a table without a header has: an integer is a #wrong count, a float the
    old error (str.isdecimal() is the pattern \\d+: Unicode digits, category Nd)."""
    return "wrong" if cell.isdecimal() else "error" if value is not None else None


def _row(
    tokens: list[str], error_column: str | None, time_ms: bool, refused: list[str]
) -> dict[str, Any] | None:
    """One table line, or None when it is not a result row of nccl-tests. The cells of its two
    halves that look like numbers but were refused (nan, inf, 1e400, 5,000 digits: their values
    are None) are added to ``refused``, for the parser to say so.

    A half is ``time algbw busbw wrong|error`` -> ``{time_us, algbw, busbw, wrong, error}``
    (``time_ms``: the first layout printed the time in milliseconds; it is given in us like
    every later one)."""
    n = len(tokens)
    if n < 11 or n > 13:
        return None
    first, second, kind = tokens[0], tokens[1], tokens[2]
    # str.isdecimal() is the pattern \d+ (Unicode digits, category Nd); what is not ASCII, or
    # longer than numbers.MAX_DIGITS, number() refuses
    if not (first.isdecimal() and second.isdecimal() and _TYPE.fullmatch(kind)):
        return None
    size, count = _digits(first), _digits(second)
    if size is None or count is None:
        return None
    redop: str | None = None
    root: int | float | None = None
    if n == 13:
        redop, root = tokens[3], number(tokens[4])
        if root is None or not _TYPE.fullmatch(redop):
            return None
    elif n == 12:
        if _TYPE.fullmatch(tokens[3]):
            redop = tokens[3]
        else:
            root = number(tokens[3])
            if root is None:
                return None
    # only the eight cells of the two halves can hold a refused number (a row whose size,
    # count or root is not one is no row)
    cells = tokens[-8:]
    values = [_short_cell(t) if len(t) <= _SHORT else _cell(t) for t in cells]
    if _REFUSED in values:
        refused += [t for t, v in zip(cells, values, strict=True) if v is _REFUSED]
        values = [None if v is _REFUSED else v for v in values]
    time, algbw, busbw, value, time_in, algbw_in, busbw_in, value_in = values
    if time_ms:
        time = None if time is None else time * 1000
        time_in = None if time_in is None else time_in * 1000
    column = column_in = error_column
    if error_column is None:
        column, column_in = _column(cells[3], value), _column(cells[7], value_in)
    return {
        "size": size,
        "count": count,
        "type": kind,
        "redop": redop,
        "root": root,
        "out_of_place": {
            "time_us": time,
            "algbw": algbw,
            "busbw": busbw,
            "wrong": value if column == "wrong" else None,
            "error": value if column == "error" else None,
        },
        "in_place": {
            "time_us": time_in,
            "algbw": algbw_in,
            "busbw": busbw_in,
            "wrong": value_in if column_in == "wrong" else None,
            "error": value_in if column_in == "error" else None,
        },
    }


def _is_failure(line: str) -> bool:
    if line.isascii() and _FAILURE_HINT.search(line.lower()) is None:
        return False
    return _FAILURES.search(line) is not None


def _digits(text: str) -> int | float | None:
    """Digits (the pattern \\d+) as to_int() reads them: number() gives the same value."""
    return _short_number(text) if len(text) <= _SHORT else number(text)


# The runs of a fleet print the same "# nThread" line (their options, not measurements)
@functools.lru_cache(maxsize=256)
def _params(line: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, pattern in _PARAMS:
        m = pattern.search(line)
        if m is None:
            out[key] = None
        elif key == "step":
            out[key] = m.group(1)
        else:
            out[key] = number(m.group(1))
    return out


def _is_table_header(line: str) -> bool:
    words = line.lstrip("#").split()
    sized = all(w in words for w in ("size", "count")) or all(w in words for w in ("bytes", "N"))
    return sized and all(w in words for w in ("type", "time", "algbw", "busbw"))


def _is_first_layout(line: str) -> bool:
    """The 2017 header ``bytes N type op time algbw busbw res``: time in ms, ``res`` the
    largest float error (nccl-tests@b188a15 src/all_reduce.cu print_header)."""
    words = line.lstrip("#").split()
    return "bytes" in words and "N" in words and "res" in words


@parser(
    KIND,
    description="nccl-tests (all_reduce_perf, all_gather_perf, ...): per-size table and trailer",
)
def parse_nccl(text: str) -> ParseResult:
    data: dict[str, Any] = {
        "test": None,
        "nccl_tests_version": None,
        "nccl_version": None,
        "params": None,
        "ranks": [],
        "rows": [],
        "error_column": None,
        "out_of_bounds": None,
        "out_of_bounds_ok": None,
        "avg_busbw": None,
        "concluded": False,
        "errors": [],
        "warnings": [],
    }
    problems: list[str] = []
    if not text.strip():
        return ParseResult(KIND, False, data, ("empty input",))

    named_test: str | None = None  # from "# Collective test starting"
    mentioned_test: str | None = None  # a binary named anywhere else (e.g. in an MPI banner)
    tables = 0
    seen_trailer_oob = False
    seen_trailer_avg = False
    bad_rows: list[str] = []
    placeholders: list[str] = []
    refused: list[str] = []
    nthread_lines = 0
    time_ms = False
    rows = data["rows"]

    for raw in clean(text).split("\n"):
        line = _PREFIX.sub("", raw, count=1) if ":" in raw else raw  # both prefixes hold a ":"
        stripped = line.strip()
        if not stripped:
            continue
        # a result row first: most lines are rows, and a row is nothing else (only numbers,
        # a type and an op name: no failure text, no binary's name)
        if stripped[0].isdigit() and (
            row := _row(stripped.split(), data["error_column"], time_ms, refused)
        ):
            rows.append(row)
            wrong, wrong_in_place = row["out_of_place"]["wrong"], row["in_place"]["wrong"]
            if (wrong is not None and wrong > 0) or (
                wrong_in_place is not None and wrong_in_place > 0
            ):
                data["errors"].append(stripped)
            continue
        # each pattern searched below only where the words it needs are (a faster test)
        if mentioned_test is None and "_perf" in stripped and (m := _BINARY.search(stripped)):
            mentioned_test = m.group(1)
        if _UNMARKED.match(stripped):
            stripped = "# " + stripped  # the first layout's unmarked header and trailer lines
        if stripped.startswith("#"):
            if stripped == "#":
                continue  # a separator: no pattern below matches it
            if m := _RANK.match(stripped):  # first: the most frequent "#" line
                number_of, device_text = m.group(1), m.group(5)
                rank, device = _digits(number_of), _digits(device_text)
                pid_text = m.group(3)
                pid = None if pid_text is None else _digits(pid_text)  # None: no Pid printed
                if rank is None or device is None or (pid_text is not None and pid is None):
                    problems.append(f"device list line not understood: {stripped[:120]!r}")
                    continue
                host: str | None = m.group(4)
                if host is not None and _PLACEHOLDER.match(host):
                    if host not in placeholders:
                        placeholders.append(host)
                    host = None
                group = m.group(2)
                data["ranks"].append(
                    {
                        "rank": rank,
                        "group": None if group is None else _digits(group),
                        "pid": pid,
                        "host": host,
                        "device": device,
                        "busid": m.group(6).strip() or None,
                        "name": m.group(7) or None,
                    }
                )
            elif m := _TESTS_VERSION.match(stripped):
                data["nccl_tests_version"] = m.group(1)
            elif m := _STARTING.match(stripped):
                named_test = named_test or m.group(1)
            elif m := _CONCLUDED.match(stripped):
                data["concluded"] = True
                named_test = named_test or m.group(1)
            elif _NTHREAD.match(stripped):
                nthread_lines += 1
                if data["params"] is None:
                    data["params"] = dict(_params(stripped))  # a copy: the cache keeps its own
            elif _is_table_header(stripped):
                tables += 1
                time_ms = time_ms or _is_first_layout(stripped)
                column = (
                    "wrong"
                    if "#wrong" in stripped
                    else "error"
                    if "error" in stripped or _is_first_layout(stripped)
                    else None
                )
                if data["error_column"] is None:
                    data["error_column"] = column
            elif m := _OOB.match(stripped):
                seen_trailer_oob = True
                data["out_of_bounds"] = number(m.group(1))
                status = (m.group(2) or "").upper()
                data["out_of_bounds_ok"] = True if status == "OK" else False if status else None
                if data["out_of_bounds"] is None:
                    problems.append(f"'Out of bounds values' is not a number: {m.group(1)!r}")
                if status == "FAILED":
                    data["errors"].append(stripped)
            elif m := _AVG.match(stripped):
                seen_trailer_avg = True
                avg = to_float(m.group(1))
                if avg is None:
                    problems.append(f"'Avg bus bandwidth' is not a number: {m.group(1)[:40]!r}")
                else:
                    data["avg_busbw"] = avg
            continue
        if "NCCL version" in stripped and (m := _NCCL_VERSION.search(stripped)):
            data["nccl_version"] = data["nccl_version"] or m.group(1)
            continue
        if "NCCL WARN" in stripped and _WARN.search(stripped):
            data["warnings"].append(stripped)
            continue
        if _is_failure(stripped):
            data["errors"].append(stripped)
            continue
        if "NCCL INFO" in stripped and _INFO.search(stripped):
            continue  # NCCL's debug lines (a host name may start with a digit)
        if stripped[0].isdigit():  # not a row (tried first, above): a result line not read
            bad_rows.append(stripped)

    data["test"] = named_test or mentioned_test
    recognised = bool(
        data["rows"]
        or tables
        or data["ranks"]
        or nthread_lines
        or seen_trailer_avg
        or seen_trailer_oob
        or named_test
    )
    if not recognised:
        if data["errors"]:
            reason = "no nccl-tests output, only failure lines: " + data["errors"][0][:120]
        else:
            reason = "no nccl-tests output (no header, device list, result table or trailer)"
        return ParseResult(KIND, False, data, (reason,))

    if bad_rows:
        problems.append(
            f"{len(bad_rows)} table line(s) not understood, first: {bad_rows[0][:120]!r}"
        )
    if refused:
        problems.append(
            f"{len(refused)} value(s) in result rows are not plausible numbers (null), first: "
            f"{refused[0][:40]!r}"
        )
    if tables > 1 or nthread_lines > 1:
        problems.append(
            f"{max(tables, nthread_lines)} runs in one output: their rows are listed in order"
        )
    if data["rows"] and not tables:
        problems.append("no column header line: the error column was read from the values")
    if not data["rows"]:
        problems.append("no result rows (the run stopped before the first size, or cut short)")
    if not seen_trailer_oob and not seen_trailer_avg:
        problems.append(
            "no trailer ('# Out of bounds values', '# Avg bus bandwidth'): output cut short "
            "or an excerpt"
        )
    elif not seen_trailer_avg:
        problems.append("no '# Avg bus bandwidth' line: output cut short or an excerpt")
    elif not seen_trailer_oob:
        problems.append("no '# Out of bounds values' line: output cut short or an excerpt")
    ranks = [r["rank"] for r in data["ranks"]]
    if not ranks:
        problems.append("no device list ('#  Rank ...' lines): ranks, hosts and GPUs unknown")
    elif sorted(ranks) != list(range(len(ranks))):
        problems.append(
            f"device list is partial: {len(ranks)} '#  Rank' line(s), ranks {min(ranks)}.."
            f"{max(ranks)}"
        )
    if placeholders:
        problems.append(
            "host names are placeholders (" + ", ".join(placeholders) + "): host set to None"
        )
    return ParseResult(KIND, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# What the judges read


@dataclass(frozen=True, slots=True)
class NcclSide:
    """One half of a result row (out-of-place or in-place) as parsed: None where the output
    showed no number (a number the parser refused is None too, and named in its problems)."""

    busbw: int | float | None
    wrong: int | float | None


@dataclass(frozen=True, slots=True)
class NcclRow:
    """One result row: the message size in bytes and both halves (None: the row has none)."""

    size: int | float | None
    out_of_place: NcclSide | None
    in_place: NcclSide | None

    def sides(self) -> tuple[tuple[str, NcclSide | None], ...]:
        return (("out_of_place", self.out_of_place), ("in_place", self.in_place))


@dataclass(frozen=True, slots=True)
class NcclRank:
    """A ``#  Rank`` line: where one rank ran (host None: a placeholder or not shown)."""

    host: str | None
    device: int | None
    busid: str | None


@dataclass(frozen=True, slots=True)
class NcclRun:
    """One nccl-tests output as the judges read it."""

    rows: tuple[NcclRow, ...]
    ranks: tuple[NcclRank, ...]
    errors: tuple[str, ...]  # failure lines, verbatim
    out_of_bounds: int | float | None
    max_bytes: int | float | None = None  # what the run was asked for (-e), from "# nThread"
    # How many GPUs the run used: the distinct (host, device) of its "#  Rank" lines (by rank
    # where the host is a placeholder); None when it lists none (an excerpt, or cut short).
    gpus_used: int | None = None
    # "NCCL version 2.16.2+cuda11.6" where the run prints it (NCCL_DEBUG=VERSION or INFO)
    nccl_version: str | None = None
    # the binary the output names ("# Collective test starting: all_gather_perf", or a
    # failure line), None where it names none
    test: str | None = None

    @property
    def largest_size(self) -> int | float | None:
        """The largest message size (bytes) a result row shows; None without rows."""
        sizes = [
            r.size
            for r in self.rows
            if isinstance(r.size, int | float) and not isinstance(r.size, bool)
        ]
        return max(sizes) if sizes else None

    def table(self) -> list[dict[str, Any]]:
        """The rows' sizes and bandwidths in the data shape (``rows``) that
        :func:`gpuctl.validation.plausible.nccl_table_lie` reads."""
        return [
            {
                "size": row.size,
                "out_of_place": _busbw_only(row.out_of_place),
                "in_place": _busbw_only(row.in_place),
            }
            for row in self.rows
        ]


def _gpus_used(ranks: Any) -> int | None:
    """The distinct GPUs of a device list (data["ranks"]): host and device; by rank where the
    host is not shown (a placeholder), so that two hosts' device 0 are not counted as one."""
    listed = [r for r in ranks if isinstance(r, Mapping)] if isinstance(ranks, list) else []
    if not listed:
        return None
    keys: set[tuple[object, ...]] = set()
    for i, r in enumerate(listed):
        if r.get("host") is None:
            keys.add(("rank", r.get("rank", i)))
        else:
            device = r.get("device")
            keys.add((r.get("host"), device if device is not None else r.get("busid") or i))
    return len(keys)


def _busbw_only(side: NcclSide | None) -> dict[str, Any] | None:
    return None if side is None else {"busbw": side.busbw}


# A run's rows are built by setting the slots of new records directly: the frozen dataclasses'
# __init__ sets each field through object.__setattr__, which costs twice as much (a node's runs
# hold ~170 rows, each with two sides). The same fields get the same values, set once.
_new = object.__new__
_SET_BUSBW = vars(NcclSide)["busbw"].__set__
_SET_WRONG = vars(NcclSide)["wrong"].__set__
_SET_SIZE = vars(NcclRow)["size"].__set__
_SET_OUT_OF_PLACE = vars(NcclRow)["out_of_place"].__set__
_SET_IN_PLACE = vars(NcclRow)["in_place"].__set__


def nccl_rows_of(data: Mapping[str, Any]) -> tuple[NcclRow, ...]:
    """The result rows of :func:`parse_nccl`'s data."""
    rows: list[NcclRow] = []
    for row in data.get("rows") or ():
        get = row.get
        record = _new(NcclRow)
        _SET_SIZE(record, get("size"))
        _SET_OUT_OF_PLACE(record, _side_of(get("out_of_place")))
        _SET_IN_PLACE(record, _side_of(get("in_place")))
        rows.append(record)
    return tuple(rows)


def _side_of(side: Any) -> NcclSide | None:
    if type(side) is not dict and not isinstance(side, Mapping):
        return None
    record = _new(NcclSide)
    _SET_BUSBW(record, side.get("busbw"))
    _SET_WRONG(record, side.get("wrong"))
    return record


def nccl_run_of(data: Mapping[str, Any]) -> NcclRun:
    """The record of :func:`parse_nccl`'s data."""
    return NcclRun(
        rows=nccl_rows_of(data),
        ranks=tuple(
            [
                NcclRank(r.get("host"), r.get("device"), r.get("busid"))
                for r in data.get("ranks") or ()
            ]
        ),
        errors=tuple(data.get("errors") or ()),
        out_of_bounds=data.get("out_of_bounds"),
        max_bytes=_max_bytes(data.get("params")),
        gpus_used=_gpus_used(data.get("ranks")),
        nccl_version=nccl_version_of(data),
        test=test if isinstance(test := data.get("test"), str) else None,
    )


def nccl_version_of(data: Mapping[str, Any]) -> str | None:
    """The NCCL version :func:`parse_nccl`'s data shows (:attr:`NcclRun.nccl_version`), read
    without building the rest of the run."""
    version = data.get("nccl_version")
    return version if isinstance(version, str) else None


def _max_bytes(params: Any) -> int | float | None:
    value = params.get("max_bytes") if isinstance(params, Mapping) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def nccl_size(text: str) -> int | None:
    """A size as nccl-tests reads its -b/-e options (``8``, ``128M``, ``8G``: K, M and G are
    powers of 1024, nccl-tests src/common.cu parsesize); None when it is not one."""
    m = re.fullmatch(r"(\d+)([KkMmGg]?)", text.strip())
    count = to_count(m.group(1)) if m else None
    return count * _SIZE_UNITS[m.group(2).upper()] if m and count is not None else None
