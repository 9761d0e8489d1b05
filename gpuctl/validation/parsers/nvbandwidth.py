"""nvbandwidth (NVIDIA's memory copy benchmark): host-to-device and device-to-host copy
bandwidth per GPU.

The kind ``nvbandwidth`` is the plain-text output of ``nvbandwidth -t <testcase>...`` as v0.2 to
v0.8 print it (NVIDIA/nvbandwidth output.cpp and inline_common.h): a version block
(``nvbandwidth Version:``, ``Built from Git version:``, ``CUDA Runtime Version:``,
``CUDA Driver Version:``, ``Driver Version:``), from v0.8 the host name, one
``Device N: NAME (dddddddd:bb:dd)`` line per GPU (v0.4 and older: no PCI address), then per
testcase ``Running <name>.``, the matrix's description, a header of column labels
(``setw(10)`` each), one row per source (a label, then ``setw(10)`` values with two decimals,
``N/A`` where nothing was measured), a blank line and ``SUM <name> <total>``. A testcase that
failed prints ``Error: <message>`` (or an ``ASSERT`` line and the process stops); one that
does not apply prints ``Waived: `` without its name; a name nvbandwidth does not know prints
``ERROR: <message>``. The JSON of ``nvbandwidth -j`` (what DCGM's nvbandwidth plugin reads) is
read as well.

Data::

    version, git_version, driver_version, cuda_runtime        None where not printed
    devices: [{index, name, bus_id}]
    testcases: [{name, status, message, description, columns, rows: [{label, values}], sum}]
        status: passed (its SUM line, or JSON "Passed"), error, waived, incomplete (no SUM:
        the run stopped inside it); values: GB/s, None for N/A
    errors: [lines]          ASSERT lines, "ERROR:" lines, pattern-check failures
    waived: N                "Waived:" lines (text mode does not name the testcase)

What the judges read: :func:`nvbandwidth_run_of` (an :class:`NvbandwidthRun`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import count_of, json_loads, plausible, to_count, to_float
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

NVBANDWIDTH = "nvbandwidth"

_VERSION = re.compile(r"nvbandwidth Version:\s*(\S{1,40})")
_GIT = re.compile(r"Built from Git version:\s*(\S{0,80})")
# v0.10 on: "CUDA Runtime Version: 13.2 (13020)", "CUDA Driver Version (API): 13.2 (13020)"
_CUDA = re.compile(r"CUDA Runtime Version:\s*(?:\d{1,4}\.\d{1,4} \()?(\d{1,9})\)?")
_CUDA_DRIVER = re.compile(r"CUDA Driver Version(?: \(API\))?:\s*(?:\d{1,4}\.\d{1,4} \()?\d{1,9}\)?")
# v0.10 on, after each SUM (bidirectional testcases: after the _total one)
_VARIATION = re.compile(r"COEFFICIENT_OF_VARIATION ([A-Za-z0-9_]{1,80}) (\S{1,40})")
# v0.2 names the testcase it waives: "Waiving device_to_device_memcpy_write_ce."
_WAIVING = re.compile(r"Waiving ([A-Za-z0-9_]{1,80})\.")
_DRIVER = re.compile(r"Driver Version:\s*(\S{1,40})")
# v0.5 on add the PCI address; v0.4 and older print the name alone
_DEVICE = re.compile(
    r"Device (\d{1,4}): (.{1,120}?)(?: \(([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\))?"
)
_RUNNING = re.compile(r"Running ([A-Za-z0-9_]{1,80})\.")
_SUM = re.compile(r"SUM ([A-Za-z0-9_]{1,80}) (\S{1,40})")
_STATUS = re.compile(r"(Error|ERROR|Waived):\s?(.{0,300})")
_NUMBER = re.compile(r"-?\d{1,30}(?:\.\d{1,30})?")
_NOTE = ("NOTE:", "Performance can vary", "Additional system-specific tuning")


# The first characters of the patterns above: a line starting otherwise (a row of a matrix)
# matches none of them
_PATTERN_STARTS = frozenset("nBCDRSWE")


def _bandwidth(token: str) -> float | None:
    return to_float(token) if _NUMBER.fullmatch(token) else None


# A fleet's matrices repeat the same short cells: their reading is remembered (bounded)
_SHORT = 40
_short_bandwidth = functools.lru_cache(maxsize=8192)(_bandwidth)


def _value(token: str, problems: list[str], where: str) -> float | str | None:
    if token == "N/A":  # noqa: S105 - the placeholder nvbandwidth prints, not a secret
        return None
    value = _short_bandwidth(token) if len(token) <= _SHORT else _bandwidth(token)
    if value is None:
        problems.append(f"{where}: not a bandwidth {token[:40]!r}")
        return token[:40]
    return value


def _new_testcase(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "status": "incomplete",
        "message": None,
        "description": None,
        "columns": [],
        "rows": [],
        "sum": None,
    }


@parser(NVBANDWIDTH, description="nvbandwidth: host-device copy bandwidth per GPU (GB/s)")
def parse_nvbandwidth(text: str) -> ParseResult:
    body = clean(text)
    if body.lstrip().startswith("{"):
        return _parse_json(body)
    data: dict[str, Any] = {
        "version": None,
        "git_version": None,
        "driver_version": None,
        "cuda_runtime": None,
        "devices": [],
        "testcases": [],
        "errors": [],
        "waived": 0,
    }
    problems: list[str] = []
    current: dict[str, Any] | None = None
    header_seen = False
    for number, raw in enumerate(body.split("\n"), 1):
        line = raw.strip()
        if not line:
            continue
        where = f"line {number}"
        pattern = line[0] in _PATTERN_STARTS  # whether a pattern below can match
        if pattern and (m := _VERSION.fullmatch(line)):
            data["version"] = m.group(1)
        elif pattern and (m := _GIT.fullmatch(line)):
            data["git_version"] = m.group(1) or None
        elif pattern and (m := _CUDA.fullmatch(line)):
            data["cuda_runtime"] = to_count(m.group(1))
        elif pattern and _CUDA_DRIVER.fullmatch(line):
            pass  # v0.5 to v0.8 print the runtime's version here again (output.cpp)
        elif pattern and (m := _DRIVER.fullmatch(line)):
            data["driver_version"] = m.group(1)
        elif pattern and (m := _DEVICE.fullmatch(line)):
            data["devices"].append(
                {
                    "index": to_count(m.group(1)),
                    "name": m.group(2),
                    "bus_id": m.group(3).lower() if m.group(3) else None,
                }
            )
        elif pattern and (m := _RUNNING.fullmatch(line)):
            current = _new_testcase(m.group(1))
            data["testcases"].append(current)
            header_seen = False
        elif pattern and (m := _SUM.fullmatch(line)):
            total = to_float(m.group(2)) if _NUMBER.fullmatch(m.group(2)) else None
            if current is None or current["name"] != m.group(1):
                problems.append(f"{where}: SUM of {m.group(1)} outside its testcase")
                continue
            current["sum"] = total
            if total is None:
                problems.append(f"{where}: not a bandwidth sum {m.group(2)[:40]!r}")
            elif current["status"] == "incomplete":
                current["status"] = "passed"
        elif pattern and _VARIATION.fullmatch(line):
            pass  # the spread of the samples (v0.10): not judged
        elif pattern and (m := _WAIVING.fullmatch(line)):
            data["waived"] += 1
            waived = _new_testcase(m.group(1))
            waived["status"] = "waived"
            data["testcases"].append(waived)
            current = None
        elif pattern and (m := _STATUS.fullmatch(line)):
            status, message = m.group(1), m.group(2).strip()
            if status == "Waived":
                data["waived"] += 1
            elif status == "ERROR" or current is None:
                data["errors"].append(line[:300])
            else:
                current["status"], current["message"] = "error", message or None
        elif line.startswith(("ASSERT", "Invalid value", "Current offset")):
            data["errors"].append(line[:300])
            if current is not None and current["status"] == "incomplete":
                current["message"] = current["message"] or line[:300]
        elif line.startswith(_NOTE):
            pass
        elif current is not None and current["description"] is None and "(GB/s)" in line:
            current["description"] = line[:200]
        elif current is not None and current["description"] is not None and not header_seen:
            current["columns"] = line.split()[:1024]
            header_seen = True
        elif current is not None and header_seen:
            words = line.split()
            values = [_value(w, problems, where) for w in words[1 : 1 + 1024]]
            if len(values) != len(current["columns"]):
                problems.append(
                    f"{where}: {len(values)} values for {len(current['columns'])} columns"
                )
            current["rows"].append({"label": words[0][:40], "values": values})
        elif current is None and not data["devices"] and " " not in line and len(line) <= 255:
            pass  # v0.8's host name, before the devices
        else:
            problems.append(f"{where}: unrecognised line {line[:120]!r}")
    if data["version"] is None and not data["testcases"]:
        return unrecognised(
            NVBANDWIDTH, "no 'nvbandwidth Version:' line and no testcase: not nvbandwidth output"
        )
    return ParseResult(NVBANDWIDTH, True, data, tuple(problems))


def _parse_json(body: str) -> ParseResult:
    try:
        doc = json_loads(body)
    except ValueError as exc:
        return unrecognised(NVBANDWIDTH, f"not JSON: {str(exc)[:120]}")
    top = doc.get("nvbandwidth") if isinstance(doc, dict) else None
    if not isinstance(top, dict):
        return unrecognised(NVBANDWIDTH, "JSON without an 'nvbandwidth' object")
    problems: list[str] = []
    testcases: list[dict[str, Any]] = []
    for i, case in enumerate(top.get("testcases") or []):
        if not isinstance(case, dict) or not isinstance(case.get("name"), str):
            problems.append(f"testcases[{i}]: no name")
            continue
        tc = _new_testcase(case["name"][:80])
        status = str(case.get("status") or "")
        tc["status"] = {"Passed": "passed", "Waived": "waived", "Error": "error"}.get(
            status, "incomplete"
        )
        tc["description"] = (
            str(case["bandwidth_description"]).strip()[:200]
            if case.get("bandwidth_description")
            else None
        )
        matrix = case.get("bandwidth_matrix") or []
        width = max((len(r) for r in matrix if isinstance(r, list)), default=0)
        tc["columns"] = [str(c) for c in range(width)]
        for r, row in enumerate(matrix if isinstance(matrix, list) else []):
            cells = row if isinstance(row, list) else []
            where = f"testcases[{i}] row {r}"
            tc["rows"].append(
                {"label": str(r), "values": [_value(str(c), problems, where) for c in cells]}
            )
        total = case.get("sum")
        tc["sum"] = plausible(total + 0.0) if isinstance(total, (int, float)) else None
        testcases.append(tc)
    cuda = top.get("CUDA Runtime Version")
    data = {
        "version": None,
        "git_version": str(top.get("git_version") or "") or None,
        "driver_version": str(top["Driver Version"]) if top.get("Driver Version") else None,
        "cuda_runtime": to_count(str(cuda)) if isinstance(cuda, int) else None,
        "devices": [],
        "testcases": testcases,
        "errors": [str(e)[:300] for e in top.get("errors") or [] if e]
        if isinstance(top.get("errors"), list)
        else [],
        "waived": sum(1 for t in testcases if t["status"] == "waived"),
    }
    return ParseResult(NVBANDWIDTH, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# The record the judges read


@dataclass(frozen=True, slots=True)
class NvbandwidthDevice:
    index: int
    name: str | None
    bus_id: str | None


@dataclass(frozen=True, slots=True)
class NvbandwidthCase:
    """One testcase: its status and matrix (rows of values, GB/s; None: N/A; a string: a value
    that was not a number, kept as read)."""

    name: str
    status: str
    message: str | None
    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[float | str | None, ...]], ...]
    total: float | None

    def per_gpu(self) -> dict[int, float | str | None]:
        """A one-row matrix between the host and each GPU (the CPU row of host_to_device and
        device_to_host): GPU index (its column) -> value. Empty for any other shape."""
        if len(self.rows) != 1:
            return {}
        out: dict[int, float | str | None] = {}
        for label, value in zip(self.columns, self.rows[0][1], strict=False):
            index = to_count(label)
            if index is not None:
                out[index] = value
        return out

    def per_pair(self) -> dict[tuple[int, int], float | str | None]:
        """A GPU x GPU matrix (device_to_device testcases): (row GPU, column GPU) -> value, the
        diagonal left out. Empty where a row or column label is not a GPU index."""
        out: dict[tuple[int, int], float | str | None] = {}
        columns = [to_count(c) for c in self.columns]
        for label, values in self.rows:
            row = to_count(label)
            if row is None or None in columns:
                return {}
            for column, value in zip(columns, values, strict=False):
                if column is not None and column != row:
                    out[(row, column)] = value
        return out


@dataclass(frozen=True, slots=True)
class NvbandwidthRun:
    version: str | None
    driver_version: str | None
    devices: tuple[NvbandwidthDevice, ...]
    testcases: tuple[NvbandwidthCase, ...]
    errors: tuple[str, ...]
    waived: int

    def case(self, name: str) -> NvbandwidthCase | None:
        return next((c for c in self.testcases if c.name == name), None)

    def bus_id(self, index: int) -> str | None:
        return next((d.bus_id for d in self.devices if d.index == index), None)


def _cell(value: Any) -> float | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return plausible(value + 0.0)
    return str(value)


def nvbandwidth_run_of(data: Mapping[str, Any]) -> NvbandwidthRun:
    """The record of :func:`parse_nvbandwidth`'s data."""
    devices = []
    for d in data.get("devices") or []:
        index = count_of(d.get("index")) if isinstance(d, Mapping) else None
        if index is not None:
            devices.append(NvbandwidthDevice(index, d.get("name"), d.get("bus_id")))
    cases = []
    for t in data.get("testcases") or []:
        if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
            continue
        rows = tuple(
            (str(r.get("label")), tuple(_cell(v) for v in r.get("values") or []))
            for r in t.get("rows") or []
            if isinstance(r, Mapping)
        )
        total = t.get("sum")
        cases.append(
            NvbandwidthCase(
                name=t["name"],
                status=str(t.get("status") or "incomplete"),
                message=t.get("message"),
                columns=tuple(str(c) for c in t.get("columns") or []),
                rows=rows,
                total=plausible(total + 0.0) if isinstance(total, (int, float)) else None,
            )
        )
    return NvbandwidthRun(
        version=data.get("version"),
        driver_version=data.get("driver_version"),
        devices=tuple(devices),
        testcases=tuple(cases),
        errors=tuple(str(e) for e in data.get("errors") or []),
        waived=count_of(data.get("waived")) or 0,
    )
