"""nvidia-smi's human-readable outputs: the default table, ``-L`` and ``-r`` (``nvlink -s``:
:mod:`gpuctl.validation.parsers.nvlink_status`).

Kinds (contract in docs/parse.md):

- ``smi-table``: ``nvidia-smi`` without arguments. Both box layouts: the narrow one of drivers
  before 535 (79 columns) and the wide ones of 535+ (87 and 89 columns), with or without the
  ``MIG M.`` row, the ``MIG devices`` box and the ``Processes`` box (with or without the GI/CI
  columns). Cells are found by splitting on ``|``, so column widths do not matter.
- ``smi-list``: ``nvidia-smi -L``, MIG device lines included.
- ``smi-reset``: ``nvidia-smi -r`` / ``--gpu-reset``.

The parsers never invent values: ``N/A`` and ``ERR!`` cells become ``None``; ``ERR!`` is also
named in the GPU's ``errors`` list and in ``problems``.
"""

from __future__ import annotations

import re
from typing import Any

from gpuctl.validation.numbers import number, to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

# ------------------------------------------------------------------------------------------
# Shared pieces

_BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
LINK_LINE = re.compile(r"Link\s+(\d+):\s*(.*)")  # nvlink -s; fullmatch: (.*) reads what (.*?) did
GPU_LINE = re.compile(r"GPU\s+(\d+):\s+(.*?)\s*(?:\(UUID:\s*([^)]*?)\s*\))?")
_NA = frozenset({"N/A", "[N/A]", "[Not Supported]", "Not Supported"})
_ERR = "ERR!"
_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_TIMESTAMP = re.compile(
    rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:{_MONTHS}) [ \d]\d \d\d:\d\d:\d\d \d{{4}}"
)
_FATAL = re.compile(
    r"NVIDIA-SMI has failed|No devices were found|Failed to initialize NVML|"
    r"couldn't communicate with the NVIDIA driver|Unable to determine the device handle",
    re.IGNORECASE,
)


def uuid_or_none(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return None if not text or text in _NA else text


def _truncated(name: str | None) -> bool:
    return name is not None and (name.endswith("...") or name.startswith("..."))


def nonblank_lines(text: str) -> list[str]:
    return [stripped for line in clean(text).split("\n") if (stripped := line.strip())]


# ------------------------------------------------------------------------------------------
# smi-table

_BORDER = re.compile(r"[+|][-=+|]*[-=][-=+|]*")
_HEADER_VERSIONS = re.compile(r"NVIDIA-SMI\s+(\S+)")
_DRIVER = re.compile(r"(?:Driver|KMD) Version:\s*(\S+)")  # KMD: 610 and later
_CUDA = re.compile(r"CUDA (?:UMD )?Version:\s*(\S+)")  # CUDA UMD: 610 and later
_GPU_ID_CELL = re.compile(r"\s*(\d+)\s+(.*\S)\s+(\S+)\s*")
_BUS_CELL = re.compile(rf"\s*({_BUS_ID})\s+(\S+)\s*")
_PERF = re.compile(r"P\d{1,2}")
_PROC_GI = re.compile(r"(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+([A-Z](?:\+[A-Z])*)\s+(.*?)\s+(\S+)")
_PROC_NO_GI = re.compile(r"(\d+)\s+(\d+)\s+([A-Z](?:\+[A-Z])*)\s+(.*?)\s+(\S+)")
_GPU_COLUMN_WORDS = ("Persistence-M", "Driver-Model", "TCC/WDDM", "Bus-Id", "Pwr:Usage/Cap")


def _slash(cell: str | None) -> tuple[list[str], list[str]] | None:
    """Split "97W /  300W" or "N/A / N/A" at its free-standing "/" (N/A has a "/" too)."""
    tokens = (cell or "").split()
    if tokens.count("/") != 1:
        return None
    at = tokens.index("/")
    return tokens[:at], tokens[at + 1 :]


def _pair(cell: str | None) -> tuple[str, str] | None:
    """ "1187MiB /  81920MiB" -> ("1187MiB", "81920MiB")."""
    halves = _slash(cell)
    if halves is None or len(halves[0]) != 1 or len(halves[1]) != 1:
        return None
    return halves[0][0], halves[1][0]


def _measure(token: str | None, suffix: str) -> tuple[int | float | None, str]:
    """A number with a unit suffix ("42C", "97W", "1187MiB", "32%"): (value, status).

    status: "ok", "na" (N/A printed), "err" (ERR! printed), "missing" (no text), "bad".
    """
    if token is None or not token.strip():
        return None, "missing"
    token = token.strip()
    if token == _ERR:
        return None, "err"
    if token in _NA:
        return None, "na"
    if suffix and not token.endswith(suffix):
        return None, "bad"
    value = number(token[: len(token) - len(suffix)] if suffix else token)
    return (value, "ok") if value is not None else (None, "bad")


def _word(token: str | None, allowed: tuple[str, ...] | None) -> tuple[str | None, str]:
    """A word cell ("On", "Default", "Enabled"): (value, status) like ``_measure``."""
    if token is None or not token.strip():
        return None, "missing"
    token = token.strip()
    if token == _ERR:
        return None, "err"
    if token in _NA:
        return None, "na"
    if allowed is not None and token not in allowed:
        return None, "bad"
    return token, "ok"


class _Gpu:
    """Collects one GPU's values and the cells it could not read."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {
            "index": None,
            "name": None,
            "name_truncated": False,
            "persistence_mode": None,
            "driver_model": None,
            "bus_id": None,
            "display_active": None,
            "volatile_uncorrected_ecc": None,
            "ecc_cell": None,
            "fan_percent": None,
            "temperature_c": None,
            "perf_state": None,
            "power_draw_w": None,
            "power_cap_w": None,
            "memory_used_mib": None,
            "memory_total_mib": None,
            "utilization_percent": None,
            "compute_mode": None,
            "mig_mode": None,
            "errors": [],
        }
        self.unreadable: list[str] = []

    def put(self, key: str, value_status: tuple[Any, str], raw: str | None) -> None:
        value, status = value_status
        self.data[key] = value
        if status == "err":
            self.data["errors"].append(key)
        elif status in ("bad", "missing"):
            self.unreadable.append(f"{key} ({raw.strip()!r})" if raw else f"{key} (missing)")


class _Table:
    """State machine over the lines of one ``nvidia-smi`` default output."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.timestamp: str | None = None
        self.versions: dict[str, str | None] = {
            "smi_version": None,
            "driver_version": None,
            "cuda_version": None,
        }
        self.header_seen = False
        self.columns_seen = False
        self.gpu_columns = ""
        self.proc_columns = ""
        self.mig_columns = ""
        self.section = ""  # "", head, gpu_cols, gpus, mig_cols, mig, proc_cols, procs
        self.pending: list[list[str]] = []
        self.gpus: list[dict[str, Any]] = []
        self.mig_devices: list[dict[str, Any]] = []
        self.mig_seen = False
        self.processes: list[dict[str, Any]] = []
        self.procs_seen = False
        self.procs_closed = False
        self.stopped = False

    # -- driving -----------------------------------------------------------------------

    def feed(self, text: str) -> None:
        for raw in clean(text).split("\n"):
            if self.stopped:
                break
            line = raw.strip()
            if not line:
                continue
            if _BORDER.fullmatch(line):
                self.border("=" in line)
            elif line.startswith("|"):
                inner = line[1:-1] if line.endswith("|") and len(line) > 1 else line[1:]
                self.row(inner.split("|"))
            else:
                self.outside(line)
        if self.pending and self.section == "gpus" and not self.stopped:
            self.problems.append("the GPU table ends without its closing border (cut short?)")
        self.flush()

    def outside(self, line: str) -> None:
        if self.timestamp is None and not self.gpus and _TIMESTAMP.fullmatch(line):
            self.timestamp = line
        else:
            self.warnings.append(line)

    def border(self, rule: bool) -> None:
        if rule:
            if self.section in ("", "head", "gpu_cols"):
                self.section = "gpus"
            elif self.section == "mig_cols":
                self.section = "mig"
            elif self.section == "proc_cols":
                self.section = "procs"
            return
        if self.section in ("gpus", "mig"):
            self.flush()
        elif self.section == "procs":
            self.procs_closed = True

    def row(self, cells: list[str]) -> None:
        text = " ".join(c.strip() for c in cells).strip()
        first = cells[0].strip() if cells else ""
        if "NVIDIA-SMI" in text and _DRIVER.search(text):
            self.header(text)
        elif first.startswith("MIG devices:"):
            self.flush()
            self.section, self.mig_seen = "mig_cols", True
        elif first.startswith(("Processes:", "Compute processes:")):
            self.flush()
            self.section, self.procs_seen = "proc_cols", True
            self.proc_columns += " " + text
        elif self.section in ("", "head", "gpu_cols") and any(
            w in text for w in (*_GPU_COLUMN_WORDS, "MIG M.", "Compute M.")
        ):
            self.section, self.columns_seen = "gpu_cols", True
            self.gpu_columns += " " + text
        elif self.section == "mig_cols":
            self.mig_columns += " " + text
        elif self.section == "proc_cols":
            self.proc_columns += " " + text
        elif self.section == "gpus":
            self.pending.append(cells)
        elif self.section == "mig":
            if "No MIG devices found" in text:
                return
            self.pending.append(cells)
        elif self.section == "procs":
            self.process(text)
        elif self.section in ("", "head") and self.looks_like_gpu_row(cells):
            self.problems.append("the GPU table's column headers are missing")
            self.section = "gpus"
            self.pending.append(cells)
        else:
            self.problems.append(f"unexpected table row: {text[:80]!r}")

    @staticmethod
    def looks_like_gpu_row(cells: list[str]) -> bool:
        return (
            len(cells) >= 2
            and _GPU_ID_CELL.fullmatch(cells[0]) is not None
            and _BUS_CELL.fullmatch(cells[1]) is not None
        )

    def header(self, text: str) -> None:
        if self.header_seen or self.gpus or self.section not in ("", "head"):
            self.problems.append(
                "a second table follows (nvidia-smi -l?); only the first one was parsed"
            )
            self.stopped = True
            return
        self.header_seen = True
        self.section = "head"
        for key, pattern in (
            ("smi_version", _HEADER_VERSIONS),
            ("driver_version", _DRIVER),
            ("cuda_version", _CUDA),
        ):
            m = pattern.search(text)
            value = m.group(1) if m else None
            self.versions[key] = None if value is None or value in _NA else value

    def flush(self) -> None:
        rows, self.pending = self.pending, []
        if not rows:
            return
        if self.section == "gpus":
            self.gpu_block(rows)
        elif self.section == "mig":
            self.mig_block(rows)

    # -- GPU blocks --------------------------------------------------------------------

    def gpu_block(self, rows: list[list[str]]) -> None:
        def cell(row: int, col: int) -> str | None:
            if row >= len(rows) or col >= len(rows[row]):
                return None
            return rows[row][col]

        m = _GPU_ID_CELL.fullmatch(cell(0, 0) or "")
        index = to_int(m.group(1)) if m is not None else None
        if m is None or index is None:
            self.problems.append(f"unrecognised GPU row: {'|'.join(rows[0])[:80]!r}")
            return
        gpu = _Gpu()
        label = f"GPU {index}"
        if any(g["index"] == index for g in self.gpus):
            self.problems.append(f"{label} appears twice in the table")
        gpu.data["index"] = index
        name = m.group(2).strip()
        gpu.put("name", _word(name, None), name)
        gpu.data["name_truncated"] = _truncated(gpu.data["name"])
        windows = "Driver-Model" in self.gpu_columns or "TCC/WDDM" in self.gpu_columns
        if windows:
            gpu.put("driver_model", _word(m.group(3), None), m.group(3))
        else:
            gpu.put("persistence_mode", _word(m.group(3), ("On", "Off")), m.group(3))

        bus = cell(0, 1)
        bm = _BUS_CELL.fullmatch(bus or "")
        if bm:
            gpu.data["bus_id"] = bm.group(1)
            gpu.put("display_active", _word(bm.group(2), ("On", "Off")), bm.group(2))
        else:
            gpu.unreadable.append(f"bus_id ({(bus or '').strip()!r})")

        ecc = cell(0, 2)
        gpu.data["ecc_cell"] = (ecc.strip() or None) if ecc is not None else None
        value, status = _measure(ecc, "")
        if status == "bad" and ecc is not None and ecc.strip() in ("On", "Off"):
            status = "na"  # with MIG enabled the cell shows the ECC mode, not a count
        gpu.put("volatile_uncorrected_ecc", (value, status), ecc)

        expected_rows = 3 if "MIG M." in self.gpu_columns else 2
        if len(rows) >= 2:
            self.gpu_metrics(gpu, cell(1, 0), cell(1, 1), cell(1, 2))
        if expected_rows == 3 and len(rows) >= 3:
            mig = cell(2, 2)
            gpu.put("mig_mode", _word(mig, ("Enabled", "Disabled")), mig)
        if len(rows) < expected_rows:
            self.problems.append(f"{label}: only {len(rows)} of {expected_rows} rows printed")
        elif len(rows) > expected_rows:
            self.problems.append(f"{label}: {len(rows) - expected_rows} unexpected extra rows")
        if gpu.data["errors"]:
            self.problems.append(f"{label}: ERR! for {', '.join(gpu.data['errors'])}")
        if gpu.unreadable:
            self.problems.append(f"{label}: cannot read {', '.join(gpu.unreadable)}")
        self.gpus.append(gpu.data)

    @staticmethod
    def gpu_metrics(gpu: _Gpu, power: str | None, memory: str | None, util: str | None) -> None:
        left, right = _slash(power) or ([], [])
        if len(left) == 4 and len(right) == 1:
            gpu.put("fan_percent", _measure(left[0], "%"), left[0])
            gpu.put("temperature_c", _measure(left[1], "C"), left[1])
            perf = _word(left[2], None)
            if perf[1] == "ok" and not _PERF.fullmatch(left[2]):
                perf = (None, "bad")
            gpu.put("perf_state", perf, left[2])
            gpu.put("power_draw_w", _measure(left[3], "W"), left[3])
            gpu.put("power_cap_w", _measure(right[0], "W"), right[0])
        else:
            gpu.unreadable.append(f"fan/temperature/perf/power ({(power or '').strip()!r})")
        mm = _pair(memory)
        if mm:
            gpu.put("memory_used_mib", _measure(mm[0], "MiB"), mm[0])
            gpu.put("memory_total_mib", _measure(mm[1], "MiB"), mm[1])
        else:
            gpu.unreadable.append(f"memory ({(memory or '').strip()!r})")
        tokens = (util or "").split(None, 1)
        if tokens:
            gpu.put("utilization_percent", _measure(tokens[0], "%"), tokens[0])
        else:
            gpu.unreadable.append("utilization (missing)")
        compute = tokens[1].strip() if len(tokens) == 2 else None
        gpu.put("compute_mode", _word(compute, None), compute)

    # -- MIG devices -------------------------------------------------------------------

    def mig_block(self, rows: list[list[str]]) -> None:
        first = rows[0]
        ids = [to_int(i) for i in first[0].split()] if first else []
        if len(ids) != 4 or any(i is None or i < 0 for i in ids):
            self.problems.append(f"unrecognised MIG device row: {'|'.join(first)[:80]!r}")
            return
        gpu_i, gi, ci, dev = ids
        label = f"MIG device {dev} of GPU {gpu_i}"
        unreadable: list[str] = []
        device: dict[str, Any] = {
            "gpu": gpu_i,
            "gi": gi,
            "ci": ci,
            "mig_dev": dev,
            "memory_used_mib": None,
            "memory_total_mib": None,
            "bar1_used_mib": None,
            "bar1_total_mib": None,
            "sm": None,
            "volatile_uncorrected_ecc": None,
            "ce": None,
            "enc": None,
            "dec": None,
            "ofa": None,
            "jpg": None,
        }

        def pair(text: str | None, used: str, total: str) -> None:
            m = _pair(text)
            if m is None:
                unreadable.append(f"{used} ({(text or '').strip()!r})")
                return
            for key, token in ((used, m[0]), (total, m[1])):
                value, status = _measure(token, "MiB")
                device[key] = value
                if status in ("bad", "missing", "err"):
                    unreadable.append(f"{key} ({token!r})")

        pair(first[1] if len(first) > 1 else None, "memory_used_mib", "memory_total_mib")
        sm_ecc = first[2].split() if len(first) > 2 else []
        if len(sm_ecc) == 2:
            for key, token in zip(("sm", "volatile_uncorrected_ecc"), sm_ecc, strict=True):
                value, status = _measure(token, "")
                device[key] = value
                if status in ("bad", "err"):
                    unreadable.append(f"{key} ({token!r})")
        else:
            unreadable.append("sm/ecc")
        engines = first[3].split() if len(first) > 3 else []
        if len(engines) == 5:
            for key, token in zip(("ce", "enc", "dec", "ofa", "jpg"), engines, strict=True):
                value, status = _measure(token, "")
                device[key] = value
                if status in ("bad", "err"):
                    unreadable.append(f"{key} ({token!r})")
        else:
            unreadable.append("ce/enc/dec/ofa/jpg")
        if len(rows) >= 2:
            pair(rows[1][1] if len(rows[1]) > 1 else None, "bar1_used_mib", "bar1_total_mib")
        elif "BAR1" in self.mig_columns:
            unreadable.append("bar1 (row missing)")
        if len(rows) > 2:
            self.problems.append(f"{label}: {len(rows) - 2} unexpected extra rows")
        if unreadable:
            self.problems.append(f"{label}: cannot read {', '.join(unreadable)}")
        self.mig_devices.append(device)

    # -- processes ---------------------------------------------------------------------

    def process(self, text: str) -> None:
        if text.startswith("No running processes found"):
            return
        with_gi = "GI" in self.proc_columns
        m = _PROC_GI.fullmatch(text) if with_gi else None
        n = None if with_gi else _PROC_NO_GI.fullmatch(text)
        if m is None and n is None:
            self.problems.append(f"unrecognised process row: {text[:80]!r}")
            return
        unreadable: list[str] = []
        proc: dict[str, Any] = {"gpu": None, "gi": None, "ci": None, "pid": None}
        if m is not None:
            gpu, gi, ci, pid, kind, name, memory = m.groups()
            for key, token in (("gi", gi), ("ci", ci)):
                value, status = _measure(token, "")
                proc[key] = value
                if status not in ("ok", "na"):
                    unreadable.append(f"{key} ({token!r})")
        elif n is not None:
            gpu, pid, kind, name, memory = n.groups()
        proc["gpu"], proc["pid"] = to_int(gpu), to_int(pid)
        if proc["gpu"] is None or proc["pid"] is None:
            self.problems.append(f"unrecognised process row: {text[:80]!r}")
            return
        proc["type"] = kind
        proc["name"] = name
        proc["name_truncated"] = _truncated(name)
        value, status = _measure(memory, "MiB")
        proc["memory_mib"] = value
        if status not in ("ok", "na"):
            unreadable.append(f"memory ({memory!r})")
        if unreadable:
            self.problems.append(f"process {pid}: cannot read {', '.join(unreadable)}")
        self.processes.append(proc)

    # -- result ------------------------------------------------------------------------

    def result(self) -> dict[str, Any]:
        if not self.header_seen:
            self.problems.append("no 'NVIDIA-SMI … Driver Version' header line")
        if not self.gpus:
            self.problems.append("no GPU rows in the table")
        mig_expected = any(g["mig_mode"] == "Enabled" for g in self.gpus)
        mig_devices: list[dict[str, Any]] | None = self.mig_devices
        if not self.mig_seen and mig_expected:
            mig_devices = None
            self.problems.append("MIG mode is enabled but there is no 'MIG devices' table")
        processes: list[dict[str, Any]] | None = self.processes
        if not self.procs_seen:
            processes = None
            if self.gpus and not self.stopped:
                self.problems.append("no 'Processes' table (output cut short?)")
        elif not self.procs_closed and not self.stopped:
            self.problems.append("the 'Processes' table is not closed (output cut short?)")
        for line in self.warnings:
            self.problems.append(f"nvidia-smi printed: {line[:160]}")
        return {
            "timestamp": self.timestamp,
            **self.versions,
            "gpu_count": len(self.gpus),
            "gpus": self.gpus,
            "mig_devices": mig_devices,
            "processes": processes,
            "warnings": self.warnings,
        }


@parser(
    "smi-table",
    description="nvidia-smi default table: versions, per-GPU state, MIG devices, processes",
)
def parse_smi_table(text: str) -> ParseResult:
    kind = "smi-table"
    if not text.strip():
        return unrecognised(kind, "empty input")
    table = _Table()
    table.feed(text)
    if not (table.header_seen or table.columns_seen or table.gpus or table.mig_seen):
        lines = nonblank_lines(text)
        fatal = [line for line in lines if _FATAL.search(line)]
        if fatal:
            return unrecognised(kind, f"no nvidia-smi table; it says: {fatal[0][:160]}")
        return unrecognised(kind, "no nvidia-smi table (no header, column or GPU rows)")
    data = table.result()
    return ParseResult(kind, True, data, tuple(table.problems))


# ------------------------------------------------------------------------------------------
# smi-list

_MIG_LINE = re.compile(r"MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)]*?)\s*\)")


@parser(
    "smi-list",
    description="nvidia-smi -L: GPUs with name and UUID, and their MIG devices",
)
def parse_smi_list(text: str) -> ParseResult:
    kind = "smi-list"
    lines = nonblank_lines(text)
    if not lines:
        return unrecognised(kind, "empty input")
    if any(LINK_LINE.fullmatch(line) or "nvlink" in line.lower() for line in lines):
        return unrecognised(kind, "has 'Link n:' or NVLink lines: this is nvidia-smi nvlink output")
    problems: list[str] = []
    gpus: list[dict[str, Any]] = []
    for line in lines:
        gm = GPU_LINE.fullmatch(line)
        mm = _MIG_LINE.fullmatch(line)
        index = to_int(gm.group(1)) if gm else None
        if gm and index is None:
            problems.append(f"GPU line with an unreadable index: {line[:80]!r}")
        elif gm:
            if any(g["index"] == index for g in gpus):
                problems.append(f"GPU {index} appears twice")
            name = gm.group(2) or None
            if name is None:
                problems.append(f"GPU {index}: no name")
            gpus.append(
                {"index": index, "name": name, "uuid": uuid_or_none(gm.group(3)), "mig": []}
            )
        elif mm:
            if not gpus:
                problems.append(f"MIG line before any GPU line: {line[:80]!r}")
                continue
            device = to_int(mm.group(2))
            if device is None:
                problems.append(f"MIG line with an unreadable device number: {line[:80]!r}")
                continue
            gpus[-1]["mig"].append(
                {"profile": mm.group(1), "device": device, "uuid": uuid_or_none(mm.group(3))}
            )
        else:
            problems.append(f"unexpected line: {line[:120]!r}")
    if not gpus:
        return unrecognised(kind, f"no 'GPU n: …' line; first line: {lines[0][:120]!r}")
    data = {
        "gpu_count": len(gpus),
        "mig_count": sum(len(g["mig"]) for g in gpus),
        "gpus": gpus,
    }
    return ParseResult(kind, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# smi-reset

_RESET_OK = re.compile(rf"GPU\s+({_BUS_ID})\s+was\s+(?:successfully\s+)?reset\.?")
_RESET_FAILED_HEAD = re.compile(r"The following GPUs? could not be reset:?")
_RESET_FAILED_ITEM = re.compile(rf"GPU\s+({_BUS_ID}):\s*(.+)")
_RESET_IN_USE = re.compile(rf"GPU\s+({_BUS_ID})\s+is currently in use by another process\.?")
_RESET_EXPLAIN = re.compile(r"\d+ devices? (?:is|are) currently being used\b.*")
_RESET_FAILURE_WORDS = re.compile(
    r"unable to reset|could not be reset|couldn't run|cannot be reset|not supported|"
    r"insufficient permissions|failed",
    re.IGNORECASE,
)
_ANY_BUS = re.compile(_BUS_ID)


@parser(
    "smi-reset",
    description="nvidia-smi -r / --gpu-reset: which GPUs were reset and why others were not",
)
def parse_smi_reset(text: str) -> ParseResult:
    kind = "smi-reset"
    lines = nonblank_lines(text)
    if not lines:
        return unrecognised(kind, "empty input")
    problems: list[str] = []
    gpus: list[dict[str, Any]] = []
    message: list[str] = []
    failed = False
    matched = False
    all_done = False
    in_failure_list = False

    def gpu(bus: str, ok: bool, reason: str | None) -> None:
        for entry in gpus:
            if entry["bus_id"] == bus:
                entry["ok"] = entry["ok"] and ok
                entry["reason"] = entry["reason"] or reason
                return
        gpus.append({"bus_id": bus, "ok": ok, "reason": reason})

    for line in lines:
        if m := _RESET_OK.fullmatch(line):
            matched, in_failure_list = True, False
            gpu(m.group(1), True, None)
        elif _RESET_FAILED_HEAD.fullmatch(line):
            matched, failed, in_failure_list = True, True, True
        elif m := _RESET_FAILED_ITEM.fullmatch(line):
            if not in_failure_list:
                problems.append(f"failure line without 'could not be reset' header: {line[:80]!r}")
            matched, failed = True, True
            gpu(m.group(1), False, m.group(2).strip())
        elif m := _RESET_IN_USE.fullmatch(line):
            matched, failed = True, True
            gpu(m.group(1), False, "currently in use by another process")
        elif _RESET_EXPLAIN.fullmatch(line):
            matched, in_failure_list = True, False
            message.append(line)
        elif line == "All done.":
            all_done, in_failure_list = True, False
        elif line.startswith("Terminating early due to previous errors"):
            failed = True
            message.append(line)
        elif "reset" in line.lower() and _RESET_FAILURE_WORDS.search(line):
            matched, failed, in_failure_list = True, True, False
            message.append(line)
            for bus in _ANY_BUS.findall(line):
                gpu(bus, False, line)
        else:
            in_failure_list = False
            problems.append(f"unexpected line: {line[:120]!r}")
    if not matched:
        return unrecognised(kind, f"no GPU reset result; first line: {lines[0][:120]!r}")
    if failed and not any(not g["ok"] for g in gpus) and not message:
        problems.append("a failure was announced but no GPU or reason follows (cut short?)")
    ok: bool | None
    if failed or any(not g["ok"] for g in gpus):
        ok = False
    elif gpus:
        ok = True
    else:
        ok = None
    data = {
        "ok": ok,
        "gpus": gpus,
        "message": " ".join(message) or None,
        "all_done": all_done,
    }
    return ParseResult(kind, True, data, tuple(problems))
