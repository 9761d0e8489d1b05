"""perftest output (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``, ``ib_*_lat`` ...).

One parser, ``perftest``, for the bandwidth and latency tests of linux-rdma/perftest, server or
client side. One text can hold several runs (a loopback log with the client's and the server's
output one after the other): the text is split into blocks, each starting at a test title
(``RDMA_Write BW Test``) or at the server's ``* Waiting for client to connect... *`` banner.

Data shape (docs/parse.md)::

    test, role, bw_unit, time_unit, device, link_type, rows, errors, warnings, settings, cuda
        # those of the first block that has a result row (else of the first block)
    blocks: [{test, role, bw_unit, time_unit, device, link_type, rows, errors, warnings,
              settings, cuda}]

    cuda: None, or where the buffer is in GPU memory (--use_cuda, --use_cuda_dmabuf):
        {device, name, listed: [{index, pci}], buffer_bytes, dmabuf, integrated}

    rows (bandwidth): {bytes, iterations, bw_peak, bw_average, msg_rate} (+ sl, bw_port1,
        msg_rate_port1, bw_port2, msg_rate_port2, cpu_util when those columns are printed)
    rows (latency): {bytes, iterations, t_min, t_max, t_typical, t_avg, t_stdev, p99, p99_9}
        (+ tps_average in duration mode)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gpuctl.validation.numbers import looks_numeric, number, to_count
from gpuctl.validation.parsing import ParseResult, clean, parser

KIND = "perftest"

_TITLE = re.compile(r"^\s*([A-Za-z][\w]*(?: [\w]+)*? (?:BW|Latency)(?: Multicast)? Test)\s*$")
_BANNER = re.compile(r"^\s*\*\s*Waiting for client to connect\.*\s*\*\s*$")
_SERVER_CM = re.compile(r"Waiting for client rdma_cm QP to connect|Please run the same command")
_SEPARATOR = re.compile(r"^\s*(?:-{5,}|\*{5,})\s*$")
_ADDRESS = re.compile(r"^\s*(?:local|remote) address\s*:", re.IGNORECASE)
_GID = re.compile(r"^\s*GID\s*:", re.IGNORECASE)
_PAIR = r"([A-Za-z][\w.*/()-]*(?: [\w.*/()-]+)*)\s*:\s*(\S+)"
_KV_LINE = re.compile(rf"^\s*{_PAIR}(?:\s+{_PAIR})?\s*$")
_COLUMN = re.compile(
    r"#bytes|#sl|#iterations|BW peak\[[^\]]*\]|BW average\[[^\]]*\]|"
    r"MsgRate(?: Port[12])?\[[^\]]*\]|BW Port[12]\[[^\]]*\]|CPU_Util\[[^\]]*\]|"
    r"t_(?:min|max|typical|avg|stdev)\[[^\]]*\]|99\.9% percentile\[[^\]]*\]|"
    r"99% percentile\[[^\]]*\]|tps average"
)
_UNIT = re.compile(r"\[([^\]]*)\]")
_WARNING = re.compile(
    r"\bwarning\b|conflicting cpu frequency|cpu frequency is not max|requested mtu is higher|"
    r"falling back|changing to this mtu|changing to active mtu|max msg size in ud|might be too big|"
    r"current tx depth is|disabling|inline size set to",
    re.IGNORECASE,
)
_ERROR = re.compile(
    r"couldn'?t|could not|unable to|\bfailed\b|failure|\berror\b|not found|no (?:ib|rdma) devices|"
    r"cannot|can'?t|invalid|mismatch|timed out|timeout|segmentation fault|aborted|refused|"
    r"unreachable|\bfatal\b|syndrom|state is down|\bnot supported\b",
    re.IGNORECASE,
)
# Lower-case text one of which every match of _WARNING (of _ERROR) holds: an ASCII line without
# any is no warning (no error) line, and the slow case-insensitive pattern is searched only where
# one is found (in other text case folding differs, U+017F the long s matches "s": searched)
_WARNING_HINT = re.compile(
    r"warning|cpu frequency|mtu|falling back|max msg size|might be too big|tx depth is|"
    r"disabling|inline size"
)
_ERROR_HINT = re.compile(
    r"couldn|could not|unable to|failed|failure|error|not found|devices|cannot|can't|cant|"
    r"invalid|mismatch|timed out|timeout|segmentation fault|aborted|refused|unreachable|fatal|"
    r"syndrom|state is down|not supported"
)


def _search_hinted(pattern: re.Pattern[str], hint: re.Pattern[str], line: str) -> bool:
    if line.isascii() and hint.search(line.lower()) is None:
        return False
    return pattern.search(line) is not None


# What perftest built with CUDA prints before the test when a buffer is in GPU memory
# (--use_cuda=N, --use_cuda_dmabuf; linux-rdma/perftest src/cuda_memory.c): which GPUs it sees,
# which one it picked, the buffer it allocated there, DMA-BUF or nvidia-peermem registration
_CUDA_LISTED = re.compile(r"^CUDA device (\d+): PCIe address is ([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})$")
_CUDA_PICKED = re.compile(r"^Picking device No\. (\d+)$")
_CUDA_NAME = re.compile(r"^\[pid = \d+, dev = (\d+)\] device name = \[(.*)\]$")
_CUDA_ALLOC = re.compile(
    r"^(?:cuMemAlloc\(\) of a (\d+) bytes GPU buffer"
    r"|allocated GPU buffer of a (\d+) address at .*)$"
)
_CUDA_DMABUF = re.compile(r"^using DMA-BUF for GPU buffer|^Calling ibv_reg_dmabuf_mr\(")
_CUDA_INTEGRATED = re.compile(r"^CUDA device integrated: ([0-9A-Fa-f]+)$")
_CUDA_CHATTER = re.compile(
    r"^(?:initializing CUDA|Listing all CUDA devices in system:|creating CUDA Ctx|"
    r"making it the current CUDA Ctx|destroying current CUDA Ctx|"
    r"There are \d+ devices supporting CUDA, picking first\.\.\.|"
    r"allocated GPU buffer address at \S+ pointer=\S+|deallocating (?:RX )?GPU buffer \S+)$"
)
# The first characters of the CUDA patterns above: a line starting otherwise is none of them
_CUDA_STARTS = frozenset("CP[cauiLmdT")

_BW_KEYS = ("bytes", "iterations", "bw_peak", "bw_average", "msg_rate")
_LAT_KEYS = (
    "bytes",
    "iterations",
    "t_min",
    "t_max",
    "t_typical",
    "t_avg",
    "t_stdev",
    "p99",
    "p99_9",
)


def _column_key(name: str) -> str:
    if name.startswith("#"):
        return name[1:]
    if name.startswith("BW peak"):
        return "bw_peak"
    if name.startswith("BW average"):
        return "bw_average"
    if name.startswith("MsgRate Port"):
        return "msg_rate_port" + name[len("MsgRate Port")]
    if name.startswith("MsgRate"):
        return "msg_rate"
    if name.startswith("BW Port"):
        return "bw_port" + name[len("BW Port")]
    if name.startswith("CPU_Util"):
        return "cpu_util"
    if name.startswith("99.9%"):
        return "p99_9"
    if name.startswith("99%"):
        return "p99"
    if name == "tps average":
        return "tps_average"
    return name.split("[", 1)[0]  # t_min ...


@dataclass
class _Block:
    test: str | None = None
    server_signs: bool = False
    columns: list[str] = field(default_factory=list)
    bw_unit: str | None = None
    time_unit: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    bad_rows: list[str] = field(default_factory=list)
    orphan_rows: int = 0
    peak_not_measured: int = 0
    cuda: dict[str, Any] | None = None  # the GPU buffer's facts (a --use_cuda run), else None

    def cuda_line(self, line: str) -> bool:
        """Reads one of perftest's CUDA lines into :attr:`cuda`; False for any other line."""
        if line[:1] not in _CUDA_STARTS:
            return False
        facts: dict[str, Any] = {}
        if m := _CUDA_LISTED.match(line):
            listed = {"index": to_count(m.group(1)), "pci": m.group(2).lower()}
            facts["listed"] = [*(self.cuda or {}).get("listed", []), listed]
        elif m := _CUDA_PICKED.match(line):
            facts["device"] = to_count(m.group(1))
        elif m := _CUDA_NAME.match(line):
            facts["device"] = to_count(m.group(1))
            facts["name"] = m.group(2).strip() or None
        elif m := _CUDA_ALLOC.match(line):
            facts["buffer_bytes"] = number(m.group(1) or m.group(2))
        elif _CUDA_DMABUF.match(line):
            facts["dmabuf"] = True
        elif m := _CUDA_INTEGRATED.match(line):
            facts["integrated"] = m.group(1) != "0"
        elif not _CUDA_CHATTER.match(line):
            return False
        base = self.cuda or {
            "device": None,
            "name": None,
            "listed": [],
            "buffer_bytes": None,
            "dmabuf": False,
            "integrated": None,
        }
        self.cuda = {**base, **facts}
        return True

    def started(self) -> bool:
        return self.test is not None or bool(self.rows) or bool(self.columns)

    def empty(self) -> bool:
        return not (
            self.started() or self.server_signs or self.settings or self.errors or self.warnings
        )

    def role(self) -> str:
        if self.server_signs:
            return "server"
        if self.test is not None and "Bidirectional" not in self.test:
            # perftest prints "TX depth" only on the client (or both sides when bidirectional)
            # and "RX depth" only on the receiving server of Send tests
            if "TX depth" in self.settings:
                return "client"
            if "RX depth" in self.settings:
                return "server"
        return "unknown"

    def header(self, line: str) -> None:
        names = _COLUMN.findall(line)
        self.columns = [_column_key(n) for n in names]
        for name in names:
            unit = _UNIT.search(name)
            if unit is None:
                continue
            if name.startswith("BW ") and self.bw_unit is None:
                self.bw_unit = unit.group(1)
            elif name.startswith("t_") and self.time_unit is None:
                self.time_unit = unit.group(1)

    def row(self, tokens: list[str]) -> None:
        values = [number(t) for t in tokens]
        if len(values) != len(self.columns) or any(v is None for v in values):
            self.bad_rows.append(" ".join(tokens))
            return
        got = dict(zip(self.columns, values, strict=True))
        base = _LAT_KEYS if self.time_unit is not None else _BW_KEYS
        row: dict[str, Any] = {key: got.get(key) for key in base}
        row.update({k: v for k, v in got.items() if k not in row})
        peak, avg = row.get("bw_peak"), row.get("bw_average")
        if peak == 0 and isinstance(avg, int | float) and avg > 0:
            # 0.00 is what perftest prints when it did not measure the peak (duration or
            # run_infinitely mode, --noPeak, the server side of a Send test): not a value
            row["bw_peak"] = None
            self.peak_not_measured += 1
        self.rows.append(row)

    def data(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "role": self.role(),
            "bw_unit": self.bw_unit,
            "time_unit": self.time_unit,
            "device": self.settings.get("Device"),
            "link_type": self.settings.get("Link type"),
            "rows": self.rows,
            "errors": self.errors,
            "warnings": self.warnings,
            "settings": self.settings,
            "cuda": self.cuda,
        }

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.orphan_rows:
            out.append(f"{self.orphan_rows} result-like line(s) before any column header: skipped")
        if self.bad_rows:
            out.append(
                f"{len(self.bad_rows)} result line(s) do not fit the {len(self.columns)} "
                f"columns, first: {self.bad_rows[0][:100]!r}"
            )
        if self.rows and self.test is None:
            out.append("no test header: test name, device and link type unknown (excerpt?)")
        if not self.rows:
            if self.columns:
                out.append("column header but no result row (output cut short or test failed)")
            elif self.test is not None:
                out.append("no result table (output cut short or test failed)")
            elif self.server_signs:
                out.append("server output ends before the test header (no client connected?)")
        if self.peak_not_measured:
            out.append(
                f"BW peak printed as 0.00 with a non-zero average in {self.peak_not_measured} "
                "row(s): not measured (duration/run_infinitely, --noPeak or server side), "
                "bw_peak set to None"
            )
        if self.unknown:
            out.append(
                f"{len(self.unknown)} line(s) not understood, first: {self.unknown[0][:100]!r}"
            )
        return out


def _classify(block: _Block, line: str) -> None:
    """Everything that neither starts a block nor is a separator."""
    stripped = line.strip()
    if "#bytes" in stripped:
        block.header(stripped)
        return
    # a result line: numbers only. One that no test prints (nan, inf, 1e308, 5,000 digits) makes
    # the line a bad row (reported, not a measurement), not a line of some other kind
    tokens = stripped.split() if stripped[:1].isdigit() else []  # a row starts with a digit
    if tokens and all(looks_numeric(t) for t in tokens):
        if block.columns:
            block.row(tokens)
        else:
            block.orphan_rows += 1
        return
    if block.cuda_line(stripped):
        return
    kind, pairs = _line_kind(line) if len(line) <= _CACHED_LINE else _line_kind_uncached(line)
    if kind == "server":
        block.server_signs = True
    elif kind == "warning":
        block.warnings.append(stripped)
    elif kind == "error":
        block.errors.append(stripped)
    elif kind == "settings":
        for key, value in pairs:
            block.settings.setdefault(key, value)
    elif kind == "unknown":
        block.unknown.append(stripped)


_CACHED_LINE = 200  # the other lines of perftest's output repeat across HCAs and nodes


@lru_cache(maxsize=8192)
def _line_kind(line: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return _line_kind_uncached(line)


def _line_kind_uncached(line: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What a line that is no header and no result row is: server, warning, error, address,
    settings (with its key/value pairs) or unknown."""
    stripped = line.strip()
    if _SERVER_CM.search(stripped):
        return "server", ()
    if _search_hinted(_WARNING, _WARNING_HINT, stripped):
        return "warning", ()
    if _search_hinted(_ERROR, _ERROR_HINT, stripped):
        return "error", ()
    if _ADDRESS.match(stripped) or _GID.match(stripped):
        return "address", ()
    if m := _KV_LINE.match(line):
        pairs = tuple(
            (key.strip(), value)
            for key, value in ((m.group(1), m.group(2)), (m.group(3), m.group(4)))
            if key is not None and value is not None
        )
        return "settings", pairs
    return "unknown", ()


_BLOCK_STARTER = re.compile(r"BW peak won't be measured", re.IGNORECASE)


def _block_starter(line: str) -> bool:
    # ASCII text: the case-insensitive pattern matches where the lower-case text holds it
    if line.isascii():
        return "bw peak won't be measured" in line.lower()
    return _BLOCK_STARTER.search(line) is not None


@parser(
    KIND,
    description="perftest ib_write_bw/ib_read_bw/ib_send_bw and *_lat: result rows per block",
)
def parse_perftest(text: str) -> ParseResult:
    empty: dict[str, Any] = {
        "test": None,
        "role": "unknown",
        "bw_unit": None,
        "time_unit": None,
        "device": None,
        "link_type": None,
        "rows": [],
        "errors": [],
        "warnings": [],
        "settings": {},
        "cuda": None,
        "blocks": [],
    }
    if not text.strip():
        return ParseResult(KIND, False, empty, ("empty input",))

    blocks: list[_Block] = [_Block()]
    for line in clean(text).split("\n"):
        stripped = line.strip()
        # each pattern tried only where the line's first or last characters allow it
        if not stripped or (stripped[0] in "-*" and _SEPARATOR.match(stripped)):
            continue
        block = blocks[-1]
        if stripped.endswith("Test") and (m := _TITLE.match(line)):
            if block.started():
                blocks.append(block := _Block())
            block.test = m.group(1)
            continue
        if stripped[0] == "*" and _BANNER.match(line):
            if block.started():
                blocks.append(block := _Block())
            block.server_signs = True
            continue
        if _block_starter(stripped) and block.started():
            blocks.append(block := _Block())
        _classify(block, line)

    blocks = [b for b in blocks if not b.empty()]
    recognised = any(b.started() or b.server_signs for b in blocks)
    parsed = [b.data() for b in blocks]
    top = next((d for d in parsed if d["rows"]), parsed[0] if parsed else None)
    data = dict(empty) if top is None else {**top, "blocks": parsed}
    if not recognised:
        errors = [e for b in blocks for e in b.errors]
        data["errors"] = errors
        reason = (
            "no perftest output, only failure lines: " + errors[0][:120]
            if errors
            else "no perftest output (no test title, result table or server banner)"
        )
        return ParseResult(KIND, False, data, (reason,))

    problems: list[str] = []
    for index, block in enumerate(blocks):
        prefix = f"block {index + 1} ({block.role()}): " if len(blocks) > 1 else ""
        problems += [prefix + p for p in block.problems()]
    return ParseResult(KIND, True, data, tuple(problems))


@dataclass(frozen=True, slots=True)
class BwRow:
    """A result row with a ``BW average`` slot: every row of a bandwidth test (the average None
    where its column is not printed), a latency row only where that column is printed. Numbers
    as printed (finite, numbers.number); None where the column is absent."""

    bytes: int | float | None
    bw_average: int | float | None  # in the record's bw_unit


@dataclass(frozen=True, slots=True)
class Perftest:
    """What a judge reads of a recognised perftest output: the block with the first result rows
    (else the first block), and how many result rows the parser read in all blocks together."""

    test: str | None  # the title as printed: "RDMA_Write BW Test", "... Bidirectional ..."
    bw_unit: str | None  # the unit in the BW column header as printed ("MB/sec", "Gb/sec")
    dual_port: str | None  # the "Dual-port" setting as printed ("ON", "OFF")
    bw_rows: tuple[BwRow, ...]
    rows_read: int
    gid_index: int | None = None  # the "GID index" setting (RoCE); None where not printed
    link_type: str | None = None  # the "Link type" setting as printed ("Ethernet", "IB")

    @property
    def bidirectional(self) -> bool:
        return "bidirectional" in (self.test or "").lower()

    @property
    def two_ports(self) -> bool:
        return (self.dual_port or "").strip().upper() == "ON"


def perftest_of(data: Mapping[str, Any]) -> Perftest:
    """The record of a recognised ``perftest`` parse (its ``data``, docs/parse.md)."""
    blocks = data["blocks"] or [data]
    return Perftest(
        test=data["test"],
        bw_unit=data["bw_unit"],
        dual_port=data["settings"].get("Dual-port"),
        bw_rows=tuple(
            BwRow(row["bytes"], row["bw_average"]) for row in data["rows"] if "bw_average" in row
        ),
        rows_read=sum(len(b["rows"]) for b in blocks),
        gid_index=to_count(data["settings"].get("GID index")),
        link_type=data.get("link_type"),
    )
