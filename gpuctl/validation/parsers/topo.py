"""``nvidia-smi topo -m`` (the link matrix) and ``nvidia-smi topo -p2p`` (peer-access matrix).

Both print a square matrix: a header row of column labels, one row per device, then (usually) a
``Legend:`` block. ``topo -m`` adds NIC columns/rows after the GPUs and affinity columns after
the matrix (``CPU Affinity``, and on newer drivers ``NUMA Affinity`` and ``GPU NUMA ID``); newer
drivers also print a ``NIC Legend:`` block (``NIC0: mlx5_0``).

What real outputs look like, and how this module copes (contract: docs/parse.md):

- Cells are tab-separated. Pastes often expand tabs to spaces; then a line has no tab and is
  split on runs of blanks (the multi-word column names are known).
- The header may be wrapped in ANSI underline escapes (``ESC[4m`` ... ``ESC[0m``): ``clean``.
- NIC column names are not labels: older drivers print the device name cut to 7 characters
  (``mlx5_ib`` eight times on Azure NDm A100 v4), some print nothing at all (Azure NDv4: runs of
  tabs, NIC rows start with a tab). NICs are therefore labelled by position, ``NIC0``..``NICn``,
  and the printed names are kept in ``nic_headers``.
- GPU rows print ``\\t\\t`` before the ``GPU NUMA ID`` value (to line up under the 13-character
  ``NUMA Affinity`` header); CPU Affinity can be blank; NIC rows end with empty cells or tabs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import number
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

TOPO = "topo"
P2P = "topo-p2p"

_GPU = re.compile(r"GPU\d+")
_NIC = re.compile(r"NIC\d+")
_NV = re.compile(r"NV\d+")
_CPU_AFFINITY = "CPU Affinity"
_NUMA_AFFINITY = "NUMA Affinity"
_GPU_NUMA_ID = "GPU NUMA ID"
_AFFINITY_COLUMNS = (_CPU_AFFINITY, _NUMA_AFFINITY, _GPU_NUMA_ID)
_HEADER_WORD = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")
# Link tokens of `topo -m` (SOC: the name older drivers printed for SYS).
_LINK_TOKENS = frozenset({"X", "SYS", "NODE", "PHB", "PXB", "PIX", "SOC"})
_LINK_SET_TEXT = "X, SYS, NODE, PHB, PXB, PIX, NV#"
# Status tokens of `topo -p2p`.
_P2P_TOKENS = frozenset({"X", "OK", "CNS", "GNS", "TNS", "NS", "DR", "U"})
_P2P_SET_TEXT = "X, OK, CNS, GNS, TNS, NS, DR, U"
_PLACEHOLDERS = frozenset({"N/A", "[N/A]", "[Not Supported]", "Unknown Error", "ERR!"})
_CPU_LIST = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
# the meaning is the rest of the line without its trailing blanks: (.*) and rstrip() read what
# (.*?)\s* does under fullmatch, without the lazy pattern's step per character
_LEGEND_ENTRY = re.compile(r"\s*([A-Za-z0-9#]+)\s*=\s*(.*)")
_NIC_LEGEND_ENTRY = re.compile(r"\s*(NIC\d+)\s*:\s*(\S+)\s*")


# ------------------------------------------------------------------------------------------
# Shared helpers


def _header_fields(line: str) -> list[str]:
    """Column names of a header line: tab-separated (blanks kept) or blank-separated."""
    if "\t" in line:
        return [f.strip() for f in line.split("\t")]
    return _HEADER_WORD.findall(line)


def _is_cell(token: str) -> bool:
    return token in _LINK_TOKENS or token in _P2P_TOKENS or bool(_NV.fullmatch(token))


def _is_header(line: str) -> bool:
    """A header starts with a ``GPU<n>`` column and has no cell token right after it."""
    fields = [f for f in _header_fields(line) if f]
    if not fields or not _GPU.fullmatch(fields[0]) or "X" in fields:
        return False
    return len(fields) == 1 or not _is_cell(fields[1])


def _is_end(line: str) -> bool:
    """The matrix ends at a blank line or at the legend."""
    stripped = line.strip()
    return not stripped or stripped.startswith(("Legend", "NIC Legend"))


def _first_line(lines: list[str]) -> str:
    for line in lines:
        if line.strip():
            return line.strip()[:120]
    return ""


def _legends(
    lines: list[str], start: int
) -> tuple[dict[str, str] | None, dict[str, str] | None, list[str]]:
    """``Legend:`` entries (token -> meaning) and ``NIC Legend:`` entries, from ``start`` on."""
    legend: dict[str, str] | None = None
    nic_legend: dict[str, str] | None = None
    problems: list[str] = []
    section: str | None = None
    for line in lines[start:]:
        stripped = line.strip()
        if stripped == "Legend:":
            section, legend = "legend", legend if legend is not None else {}
            continue
        if stripped == "NIC Legend:":
            section, nic_legend = "nic", nic_legend if nic_legend is not None else {}
            continue
        if not stripped or section is None:
            continue
        if section == "legend" and legend is not None:
            m = _LEGEND_ENTRY.fullmatch(line)
            if m and m.group(1) not in legend:
                legend[m.group(1)] = m.group(2).rstrip()
            elif not m:
                section = None  # something else follows the legend
        elif section == "nic" and nic_legend is not None:
            m = _NIC_LEGEND_ENTRY.fullmatch(line)
            if m and m.group(1) not in nic_legend:
                nic_legend[m.group(1)] = m.group(2)
            elif not m:
                section = None
    if legend is not None and not legend:
        problems.append("'Legend:' has no entries (output cut short?)")
    if nic_legend is not None and not nic_legend:
        problems.append("'NIC Legend:' has no entries (output cut short?)")
    return legend, nic_legend, problems


class _Cells:
    """Collects cell-level findings so that one bad token gives one problem, not hundreds."""

    def __init__(self, valid: frozenset[str], set_text: str, what: str, nvlink: bool) -> None:
        self.valid = valid
        self.nvlink = nvlink  # NV<n> tokens are valid
        self.set_text = set_text
        self.what = what
        self.unknown: dict[str, list[str]] = {}
        self.blank: list[str] = []
        self.bad_diagonal: list[str] = []
        self.off_diagonal_x: list[str] = []
        self.seen: set[str] = set()
        self.raw: set[str] = set()
        # tokens known to be valid off the diagonal (NV<n> ones added as they are found)
        self.ok: set[str] = set(valid) - {"X", ""}

    def valid_token(self, token: str) -> bool:
        return token in self.valid or (self.nvlink and bool(_NV.fullmatch(token)))

    def cell(self, row: str, col: str, value: str) -> str | None:
        """The value to store for an off-diagonal cell (None when it is not a valid token)."""
        self.raw.add(value)
        if value in self.valid and value != "X" and value:  # the common case, tested first
            self.seen.add(value)
            return value
        if not value:
            self.blank.append(f"{row}->{col}")
            return None
        if value == "X":
            self.off_diagonal_x.append(f"{row}->{col}")
            return None
        if not self.valid_token(value):
            self.unknown.setdefault(value, []).append(f"{row}->{col}")
            return None
        self.seen.add(value)
        self.ok.add(value)
        return value

    def row(
        self, device: str, devices: list[str], tokens: list[str], links: dict[str, str | None]
    ) -> None:
        """Store the matrix cells ``tokens`` of ``device``'s row (``devices``: the columns, in
        order; ``device`` is one of them) in ``links``."""
        d = devices.index(device)
        off = tokens[:d] + tokens[d + 1 :]
        if self.ok.issuperset(off):  # the common row: no cell to complain about, in bulk
            self.raw.update(off)
            self.seen.update(off)
            links.update(zip(devices[:d] + devices[d + 1 :], off, strict=False))
            if d < len(tokens):
                self.diagonal(device, tokens[d])
            return
        for col, token in zip(devices, tokens, strict=False):
            if col == device:
                self.diagonal(device, token)
            else:
                links[col] = self.cell(device, col, token)

    def diagonal(self, device: str, value: str) -> None:
        self.raw.add(value)
        if value != "X":
            self.bad_diagonal.append(f"{device} ({value!r})" if value else f"{device} (blank)")

    def problems(self) -> list[str]:
        out = []
        for token, where in self.unknown.items():
            out.append(
                f"unknown {self.what} token {token!r} in {len(where)} cell(s), first at "
                f"{where[0]} (legend: {self.set_text}); stored as null"
            )
        if self.blank:
            out.append(f"{len(self.blank)} blank cell(s), first at {self.blank[0]}; null")
        if self.off_diagonal_x:
            out.append(
                f"'X' (self) off the diagonal in {len(self.off_diagonal_x)} cell(s), first at "
                f"{self.off_diagonal_x[0]}; null"
            )
        if self.bad_diagonal:
            out.append(f"diagonal is not 'X' for {', '.join(self.bad_diagonal[:8])}")
        return out


def _asymmetry(links: dict[str, dict[str, str | None]], devices: list[str]) -> list[str]:
    pairs = []
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            ab, ba = links[a][b], links[b][a]
            if ab is not None and ba is not None and ab != ba:
                pairs.append(f"{a}->{b}={ab} but {b}->{a}={ba}")
    if not pairs:
        return []
    return [f"matrix is not symmetric in {len(pairs)} pair(s): {'; '.join(pairs[:4])}"]


def _affinity(value: str | None, column: str, gpu: str, problems: list[str]) -> str | None:
    """A CPU/NUMA affinity cell as printed; None when blank, a placeholder, or not a CPU list."""
    if value is None or not value or value in _PLACEHOLDERS:
        return None
    if _CPU_LIST.fullmatch(value):
        return value
    problems.append(f"{gpu}: {column} {value!r} is not a CPU/NUMA list; null")
    return None


# ------------------------------------------------------------------------------------------
# topo -m


def _split_trailing(
    trailing: list[str], names: list[str], tabbed: bool, gpu: str, problems: list[str]
) -> dict[str, str | None]:
    """Map the cells after the matrix to the affinity columns of the header."""
    values: dict[str, str | None] = dict.fromkeys(names)
    cells = list(trailing)
    if tabbed:
        # `NUMA Affinity` is followed by two tabs before the `GPU NUMA ID` value.
        if names and names[-1] == _GPU_NUMA_ID and len(cells) > len(names):
            k = len(names) - 1
            if cells[k] == "":
                del cells[k]
        while len(cells) > len(names) and cells[-1] == "":
            cells.pop()
        if len(cells) > len(names):
            problems.append(
                f"{gpu}: unexpected extra cells after the matrix: {cells[len(names) :]}"
            )
        if len(cells) < len(names):
            problems.append(f"{gpu}: row cut short: no value for {', '.join(names[len(cells) :])}")
        for name, cell in zip(names, cells, strict=False):
            values[name] = cell
        return values
    if len(cells) == len(names):
        for name, cell in zip(names, cells, strict=True):
            values[name] = cell
    elif names:
        problems.append(
            f"{gpu}: {len(cells)} value(s) for {len(names)} column(s) ({', '.join(names)}) in "
            "space-separated output: blank cells cannot be placed; all null"
        )
    return values


def _row_fields(line: str) -> tuple[list[str], bool]:
    """Label then cells of a matrix row, and whether it was tab-separated."""
    if "\t" in line:
        return [f.strip() for f in line.split("\t")], True
    tokens = line.split()
    if tokens and _is_cell(tokens[0]):
        tokens.insert(0, "")  # a row without a label (Azure NDv4 NIC rows)
    return tokens, False


def _topo_data(
    gpus: list[str],
    nics: list[str],
    nic_headers: list[str | None],
    links: dict[str, dict[str, str | None]],
    affinity_columns: list[str],
) -> dict[str, Any]:
    return {
        "gpus": gpus,
        "nics": nics,
        "nic_headers": nic_headers,
        "nic_names": dict.fromkeys(nics),
        "links": links,
        "affinity_columns": affinity_columns,
        "cpu_affinity": dict.fromkeys(gpus),
        "numa_affinity": dict.fromkeys(gpus),
        "gpu_numa_id": dict.fromkeys(gpus) if _GPU_NUMA_ID in affinity_columns else None,
        "legend": None,
        "tokens_seen": [],
    }


@parser(
    TOPO,
    description="nvidia-smi topo -m: GPU/NIC link matrix, CPU/NUMA affinity, legends",
)
def parse_topo(text: str) -> ParseResult:
    body = clean(text)
    if not body.strip():
        return unrecognised(TOPO, "empty input")
    lines = body.split("\n")
    head = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if head is None:
        return unrecognised(
            TOPO,
            "no `nvidia-smi topo -m` header row (GPU0 ... CPU Affinity); first line: "
            f"{_first_line(lines)!r}",
        )
    problems: list[str] = []

    # Header: [label column] GPU columns, NIC columns, affinity columns.
    cols = _header_fields(lines[head])
    if "\t" in lines[head] and cols and cols[0] == "":
        cols = cols[1:]
    while cols and cols[-1] == "":
        cols.pop()
    g_end = 0
    while g_end < len(cols) and _GPU.fullmatch(cols[g_end]):
        g_end += 1
    gpus = cols[:g_end]
    a_start = next((i for i in range(g_end, len(cols)) if cols[i] in _AFFINITY_COLUMNS), len(cols))
    nic_headers: list[str | None] = [name or None for name in cols[g_end:a_start]]
    nics = [f"NIC{i}" for i in range(len(nic_headers))]
    trailing_names = cols[a_start:]  # as printed, to line the cells up
    affinity_columns: list[str] = []
    for column in trailing_names:
        if column in _AFFINITY_COLUMNS and column not in affinity_columns:
            affinity_columns.append(column)
        else:
            problems.append(f"header column {column!r} after the matrix is not known; ignored")
    for i, printed_name in enumerate(nic_headers):
        if printed_name is not None and _NIC.fullmatch(printed_name) and printed_name != nics[i]:
            problems.append(
                f"NIC column {i} is printed as {printed_name!r}; labelled {nics[i]} by position"
            )
    devices = gpus + nics
    links: dict[str, dict[str, str | None]] = {
        a: {b: None for b in devices if b != a} for a in devices
    }
    data = _topo_data(gpus, nics, nic_headers, links, affinity_columns)
    if len(set(gpus)) != len(gpus):
        problems.append(f"GPU columns are not unique ({', '.join(gpus)}): matrix not read")
        data["links"] = {}
        return ParseResult(TOPO, True, data, tuple(problems))
    if _CPU_AFFINITY not in affinity_columns:
        problems.append("no 'CPU Affinity' column in the header (header cut short?)")

    # Matrix rows.
    legend, nic_legend, legend_problems = _legends(lines, head + 1)
    valid = set(_LINK_TOKENS) | {t for t in (legend or {}) if t != "NV#"}
    cells = _Cells(frozenset(valid), _LINK_SET_TEXT, "link", nvlink=True)
    seen_rows: set[str] = set()
    nic_row = 0
    for n in range(head + 1, len(lines)):
        line = lines[n]
        if _is_end(line):
            break
        fields, tabbed = _row_fields(line)
        if not fields:
            continue
        label = fields[0]
        if _GPU.fullmatch(label):
            if label not in gpus:
                problems.append(f"row {label!r} is not a column of the header; ignored")
                continue
            device = label
        else:
            if nic_row >= len(nics):
                problems.append(f"unexpected row {line.strip()[:60]!r}; ignored")
                continue
            device = nics[nic_row]
            printed = nic_headers[nic_row]
            nic_row += 1
            if label and printed is not None and label != printed:
                problems.append(f"{device}: row is labelled {label!r} but column is {printed!r}")
        if device in seen_rows:
            problems.append(f"second row for {device}; ignored")
            continue
        seen_rows.add(device)
        row_cells = fields[1 : 1 + len(devices)]
        if len(row_cells) < len(devices):
            problems.append(
                f"{device}: row has {len(row_cells)} of {len(devices)} matrix cells (cut short)"
            )
        cells.row(device, devices, row_cells, links[device])
        if device in gpus:
            values = _split_trailing(
                fields[1 + len(devices) :], trailing_names, tabbed, device, problems
            )
            data["cpu_affinity"][device] = _affinity(
                values.get(_CPU_AFFINITY), _CPU_AFFINITY, device, problems
            )
            data["numa_affinity"][device] = _affinity(
                values.get(_NUMA_AFFINITY), _NUMA_AFFINITY, device, problems
            )
            if data["gpu_numa_id"] is not None:
                raw = values.get(_GPU_NUMA_ID)
                numa_id = number(raw)
                if isinstance(numa_id, int) and numa_id >= 0:
                    data["gpu_numa_id"][device] = numa_id
                elif raw and raw not in _PLACEHOLDERS:
                    problems.append(f"{device}: GPU NUMA ID {raw!r} is not a number; null")

    # topo -p2p output has the same shape but status tokens and no affinity columns.
    p2p_only = _P2P_TOKENS - {"X"}
    looks_p2p = bool(cells.raw & p2p_only) or "OK" in (legend or {})
    link_like = any(t in _LINK_TOKENS - {"X"} or _NV.fullmatch(t) for t in cells.raw)
    if not affinity_columns and not nics and looks_p2p and not link_like:
        return unrecognised(TOPO, "this is `nvidia-smi topo -p2p` output (kind topo-p2p)")

    if not seen_rows:
        if not affinity_columns:
            return unrecognised(TOPO, f"only a header-like line: {lines[head].strip()[:80]!r}")
        problems.append("no matrix rows after the header (output cut short)")
    else:
        missing = [d for d in devices if d not in seen_rows]
        if missing:
            problems.append(f"no row for {', '.join(missing)} (output cut short?)")
    problems += cells.problems()
    problems += _asymmetry(links, devices)

    # Legends.
    problems += legend_problems
    data["legend"] = legend
    data["tokens_seen"] = sorted(cells.seen)
    if nic_legend is not None:
        for nic in nics:
            data["nic_names"][nic] = nic_legend.get(nic)
        absent = [nic for nic in nics if nic not in nic_legend]
        if absent:
            problems.append(f"NIC Legend has no name for {', '.join(absent)}")
        extra = [nic for nic in nic_legend if nic not in nics]
        if extra:
            problems.append(f"NIC Legend names {', '.join(extra)}, not in the matrix")
    elif any(name is not None and _NIC.fullmatch(name) for name in nic_headers):
        problems.append(
            "NIC columns are labelled NIC<n> but no 'NIC Legend:' follows: names unknown"
        )
    return ParseResult(TOPO, True, data, tuple(problems))


@dataclass(frozen=True, slots=True)
class Topology:
    """``topo -m`` as the judges read it: the GPU columns as listed (a GPU listed twice is
    there twice), the NICs (``NIC0``..), and the link token of each ordered device pair."""

    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    links: Mapping[str, Mapping[str, str | None]]

    def link(self, a: str, b: str) -> str | None:
        """The token from ``a`` to ``b`` (``NV18``, ``PIX``, ``SYS`` ...); None: not shown."""
        return (self.links.get(a) or {}).get(b)


def adapter_names(data: Mapping[str, Any]) -> dict[str, str]:
    """Adapter name -> its column (``mlx5_0`` -> ``NIC0``): from the NIC Legend (drivers since
    about 470), else from the column headers of older drivers, which print the device name
    there. Blank or missing names are left out."""
    names: Mapping[str, str | None] = data.get("nic_names") or {}
    headers = list(data.get("nic_headers") or ())
    out: dict[str, str] = {}
    for i, nic in enumerate(data.get("nics") or ()):
        name = names.get(nic) or (headers[i] if i < len(headers) else None)
        if name and name != nic:
            out.setdefault(str(name), str(nic))
    return out


def topology_of(data: Mapping[str, Any]) -> Topology:
    """The record of :func:`parse_topo`'s data."""
    return Topology(
        gpus=tuple(data.get("gpus") or ()),
        nics=tuple(nics) if isinstance(nics := data.get("nics"), Iterable) else (),
        links=data.get("links") or {},
    )


# ------------------------------------------------------------------------------------------
# topo -p2p


def _is_p2p_header(line: str) -> bool:
    fields = [f for f in _header_fields(line) if f]
    return bool(fields) and all(_GPU.fullmatch(f) for f in fields)


@parser(
    P2P,
    description="nvidia-smi topo -p2p r|w|rw|n|a: GPU peer-to-peer capability matrix",
)
def parse_topo_p2p(text: str) -> ParseResult:
    body = clean(text)
    if not body.strip():
        return unrecognised(P2P, "empty input")
    lines = body.split("\n")
    head = next((i for i, line in enumerate(lines) if _is_p2p_header(line)), None)
    if head is None:
        if any(_is_header(line) and _CPU_AFFINITY in line for line in lines):
            return unrecognised(P2P, "this is `nvidia-smi topo -m` output (kind topo)")
        return unrecognised(
            P2P,
            f"no `nvidia-smi topo -p2p` header row (GPU0 GPU1 ...); first line: "
            f"{_first_line(lines)!r}",
        )
    problems: list[str] = []
    gpus = [f for f in _header_fields(lines[head]) if f]
    matrix: dict[str, dict[str, str | None]] = {a: {b: None for b in gpus if b != a} for a in gpus}
    data: dict[str, Any] = {
        "gpus": gpus,
        "matrix": matrix,
        "legend": None,
        "tokens_seen": [],
        "all_ok": None,
    }
    if len(set(gpus)) != len(gpus):
        problems.append(f"GPU columns are not unique ({', '.join(gpus)}): matrix not read")
        data["matrix"] = {}
        return ParseResult(P2P, True, data, tuple(problems))

    legend, _nic_legend, legend_problems = _legends(lines, head + 1)
    valid = set(_P2P_TOKENS) | set(legend or {})
    cells = _Cells(frozenset(valid), _P2P_SET_TEXT, "P2P status", nvlink=False)
    seen_rows: set[str] = set()
    for n in range(head + 1, len(lines)):
        line = lines[n]
        if _is_end(line):
            break
        fields = [f.strip() for f in line.split("\t")] if "\t" in line else line.split()
        if not fields:
            continue
        label = fields[0]
        if label not in gpus:
            problems.append(f"unexpected row {line.strip()[:60]!r}; ignored")
            continue
        if label in seen_rows:
            problems.append(f"second row for {label}; ignored")
            continue
        seen_rows.add(label)
        row_cells = fields[1 : 1 + len(gpus)]
        extra = [f for f in fields[1 + len(gpus) :] if f]
        if extra:
            problems.append(f"{label}: unexpected extra cells {extra}")
        if len(row_cells) < len(gpus):
            problems.append(f"{label}: row has {len(row_cells)} of {len(gpus)} cells (cut short)")
        for j, token in enumerate(row_cells):
            col = gpus[j]
            if col == label:
                cells.diagonal(label, token)
            else:
                matrix[label][col] = cells.cell(label, col, token)

    if not seen_rows:
        if legend is None or "OK" not in legend:
            return unrecognised(P2P, f"only a header-like line: {lines[head].strip()[:80]!r}")
        problems.append("no matrix rows after the header (output cut short)")
    else:
        missing = [g for g in gpus if g not in seen_rows]
        if missing:
            problems.append(f"no row for {', '.join(missing)} (output cut short?)")
    problems += cells.problems()
    problems += _asymmetry(matrix, gpus)
    problems += legend_problems
    data["legend"] = legend
    data["tokens_seen"] = sorted(cells.seen)
    values = [v for row in matrix.values() for v in row.values()]
    if any(v is not None and v != "OK" for v in values):
        data["all_ok"] = False
    elif values and all(v == "OK" for v in values):
        data["all_ok"] = True
    return ParseResult(P2P, True, data, tuple(problems))


@dataclass(frozen=True, slots=True)
class P2pMatrix:
    """``nvidia-smi topo -p2p``: the GPUs (``GPU0`` ...), each ordered pair's status token
    (None: the cell was unreadable or missing) and the legend's meanings."""

    gpus: tuple[str, ...]
    pairs: Mapping[tuple[str, str], str | None]
    legend: Mapping[str, str]


# the meanings nvidia-smi prints in its legend, for a token a legend-less capture shows
P2P_MEANINGS = {
    "OK": "Status Ok",
    "CNS": "Chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "Topology not supported",
    "NS": "Not supported",
    "DR": "Disabled by regkey",
    "U": "Unknown",
}


def p2p_matrix_of(data: Mapping[str, Any]) -> P2pMatrix:
    """The record of :func:`parse_topo_p2p`'s data."""
    gpus = tuple(str(g) for g in data.get("gpus") or ())
    matrix = data.get("matrix") or {}
    pairs: dict[tuple[str, str], str | None] = {}
    for row, cells in matrix.items() if isinstance(matrix, Mapping) else ():
        for column, token in (cells or {}).items():
            pairs[(str(row), str(column))] = token if isinstance(token, str) else None
    legend = data.get("legend") or {}
    return P2pMatrix(
        gpus,
        pairs,
        {**P2P_MEANINGS, **{str(k): str(v) for k, v in legend.items()}}
        if isinstance(legend, Mapping)
        else dict(P2P_MEANINGS),
    )
