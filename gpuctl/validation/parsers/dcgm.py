"""DCGM: ``dcgmi diag -r N`` (text table or ``-j`` JSON) and ``dcgmi nvlink -s``.

Data shapes (documented in docs/parse.md):

``dcgm-diag``::

    format: "text" | "json"
    version: str | None              # "DCGM Version" / JSON "version"
    driver_version: str | None       # "Driver Version Detected"
    gpu_device_ids: list[str] | None # "GPU Device IDs Detected" (PCI device ids, one per GPU)
    metadata: {label: str}           # every Metadata row as printed (text), or JSON metadata
    tests: [{name, category, result, gpus: {gpu: result}, all_gpus: bool,
             messages: [{level, text, gpu}]}]
    section_messages: [{category, level, text}]  # Error/Warning/Info rows with no test above
    summary: {"Pass": n, "Fail": n, "Warn": n, "Skip": n}
    runtime_error: str | None        # JSON "runtime_error" (the diagnostic did not run)
    complete: bool                   # header and closing border seen (text) / JSON parsed
    overall: "Pass" | "Fail" | None

``dcgm-nvlink``::

    gpus: {gpu_id: [state, ...]} | None        # U (up) D (down) X (disabled) _ (not supported)
    nvswitches: {physical_id: [state, ...]} | None   # {} when "No NvSwitches found."
    links_not_up: [{entity, id, link, state}]  # every D or X link

What the judges read of ``dcgm-diag``: :func:`diag_of` (a :class:`DcgmDiag`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import json_raw_decode
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

DIAG = "dcgm-diag"
NVLINK = "dcgm-nvlink"

RESULTS = ("Pass", "Fail", "Warn", "Skip")
_MESSAGE_LEVELS = {"warning": "Warning", "error": "Error", "info": "Info"}

# "+-----  Integration  -------+-----...+" or "|-----  Deployment  --------+-----...|"
_SECTION = re.compile(r"^[|+]-+\s+([A-Za-z][A-Za-z0-9 /]*?)\s+-+\+-+[|+]?\s*$")
_BORDER = re.compile(r"^\+-+\+-+\+?\s*$")
_DOUBLE = re.compile(r"^\+=+\+=+\+?\s*$")
_HEADER = re.compile(r"^\|\s*Diagnostic\s*\|\s*Result\s*\|?\s*$")
_RESULT = re.compile(
    r"^(Pass|Fail|Warn|Skip)(?:\s*-\s*(?:(All)|GPUs?\s*:\s*([\d,\s]*)))?\s*$", re.IGNORECASE
)
_GPU_LIST_CONT = re.compile(r"^[\d,\s]+$")
_CODE = re.compile(r"^\s*Code:\s*\((\d+)\)\s*$")


def _norm_result(word: str) -> str | None:
    low = word.strip().lower()
    table = {
        "pass": "Pass",
        "passed": "Pass",
        "fail": "Fail",
        "failed": "Fail",
        "warn": "Warn",
        "warning": "Warn",
        "skip": "Skip",
        "skipped": "Skip",
    }
    return table.get(low)


def _aggregate(results: list[str | None]) -> str | None:
    """One result for a test from its per-GPU results: Fail > Warn > Pass > Skip."""
    for word in ("Fail", "Warn", "Pass", "Skip"):
        if word in results:
            return word
    return None


def _gpu_ids(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip().isdigit()]


# ------------------------------------------------------------------------------------------
# dcgmi diag: text table


class _Row:
    """One logical row of the diag table: a name cell and the value chunks under it."""

    __slots__ = ("category", "chunks", "name", "widths")

    def __init__(self, name: str, category: str | None) -> None:
        self.name = name
        self.category = category
        self.chunks: list[str] = []
        self.widths: list[int | None] = []  # printable width of each chunk's cell (None: open)


def _split_row(line: str) -> tuple[str, str, bool] | None:
    """``| name | value |`` -> (name cell, value cell, closed); None when not a 2-cell row."""
    if not line.startswith("|"):
        return None
    parts = line.split("|")
    if len(parts) < 3:
        return None
    closed = line.rstrip().endswith("|") and len(parts) >= 4
    name = parts[1]
    value = "|".join(parts[2:-1]) if closed else "|".join(parts[2:])
    return name, value, closed


def _join_wrapped(chunks: list[str], widths: list[int | None]) -> str:
    """Re-join text that dcgmi hard-wrapped every 45 characters (mid-word, no hyphen).

    A cell is `` <chunk><pad> ``; a chunk that fills its cell was cut mid-text, so the next
    one follows directly. A shorter chunk ended at a word (another wrapper): join with a space.
    """
    out = ""
    for i, (raw, width) in enumerate(zip(chunks, widths, strict=True)):
        body = raw[1:] if raw.startswith(" ") else raw
        if width is not None and len(body) >= width:
            body = body[:width]
        if i == len(chunks) - 1:
            out += body.rstrip()
            break
        full = width is not None and len(body.rstrip(" ")) >= width
        if full:
            out += body
        else:
            out += body.strip() + " "
    return re.sub(r"\s+", " ", out).strip()


def _parse_diag_text(text: str) -> ParseResult:
    lines = text.split("\n")
    problems: list[str] = []
    banners: list[str] = []
    rows: list[_Row] = []
    category: str | None = None
    saw_header = saw_section = closed = False
    unclosed_rows = 0
    current: _Row | None = None
    headers = 0

    for raw in lines:
        line = raw.rstrip("\n").replace("\t", "    ")
        stripped = line.strip()
        if not stripped:
            continue
        if _HEADER.match(stripped):
            saw_header = True
            headers += 1
            current = None
            closed = False
            continue
        if _DOUBLE.match(stripped):
            continue
        section = _SECTION.match(stripped)
        if section:
            saw_section = True
            category = section.group(1).strip()
            current = None
            closed = False
            continue
        if _BORDER.match(stripped):
            # the top border comes before anything else; a border after rows is the footer
            if rows or saw_section:
                closed = True
            current = None
            continue
        cells = _split_row(line.lstrip())
        if cells is None:
            if stripped.startswith(("Error", "error", "ERROR")):
                banners.append(stripped)
            elif stripped.startswith("Successfully ran diagnostic"):
                pass
            elif rows or saw_header:
                problems.append(f"unexpected line in the diag table: {stripped[:80]!r}")
            continue
        name_cell, value_cell, row_closed = cells
        if not row_closed:
            unclosed_rows += 1
        closed = False
        width = len(value_cell) - 3 if row_closed and len(value_cell) > 3 else None
        if name_cell.strip():
            current = _Row(name_cell.strip(), category)
            rows.append(current)
        elif current is None:
            problems.append(f"continuation row with no row above it: {stripped[:80]!r}")
            continue
        current.chunks.append(value_cell)
        current.widths.append(width)

    looks_like_diag = saw_header or saw_section or any(_is_result_row(r) for r in rows)
    if not looks_like_diag:
        if banners:
            return unrecognised(DIAG, f"no diag table, only an error: {banners[0][:200]}")
        return unrecognised(DIAG, "no dcgmi diag table (no 'Diagnostic | Result' header)")

    metadata: dict[str, str | None] = {}
    tests: list[dict[str, Any]] = []
    section_messages: list[dict[str, Any]] = []
    last_test: dict[str, Any] | None = None
    for row in rows:
        level = _MESSAGE_LEVELS.get(row.name.lower())
        if row.category is not None and row.category.lower() == "metadata":
            value = _join_wrapped(row.chunks, row.widths)
            metadata[row.name] = value or None
            continue
        if level is not None:
            message = {"level": level, "text": _join_wrapped(row.chunks, row.widths), "gpu": None}
            if last_test is not None and last_test["category"] == row.category:
                last_test["messages"].append(message)
            else:
                section_messages.append(
                    {"category": row.category, "level": level, "text": message["text"]}
                )
            continue
        last_test = _text_test(row, problems)
        tests.append(last_test)

    if headers > 1:
        problems.append(f"{headers} diag tables (iterations?): their rows are listed together")
    if not saw_header:
        problems.append("no 'Diagnostic | Result' header: a fragment of the table")
    if unclosed_rows:
        problems.append(f"{unclosed_rows} row(s) without a closing '|': cut off")
    if not closed:
        problems.append("no closing border after the last row: the table is incomplete")
    for banner in banners:
        problems.append(f"dcgmi error: {banner[:200]}")
    complete = saw_header and closed and unclosed_rows == 0
    if not tests and complete:
        problems.append("the table lists no tests")
    return _diag_result("text", tests, section_messages, metadata, None, complete, problems)


def _is_result_row(row: _Row) -> bool:
    if not row.chunks:
        return False
    return bool(_RESULT.match(row.chunks[0].strip()))


def _text_test(row: _Row, problems: list[str]) -> dict[str, Any]:
    gpus: dict[str, str] = {}
    all_gpus = False
    results: list[str | None] = []
    messages: list[dict[str, Any]] = []
    last_word: str | None = None
    code: str | None = None
    for chunk in row.chunks:
        value = chunk.strip()
        if not value:
            continue
        match = _RESULT.match(value)
        if match:
            word = _norm_result(match.group(1))
            last_word = word
            results.append(word)
            if match.group(2):
                all_gpus = True
            elif match.group(3) is not None and word is not None:
                for gpu in _gpu_ids(match.group(3)):
                    gpus[gpu] = word
            continue
        if last_word is not None and _GPU_LIST_CONT.match(value):
            for gpu in _gpu_ids(value):
                gpus[gpu] = last_word
            continue
        code_match = _CODE.match(value)
        if code_match:
            code = code_match.group(1)
            continue
        problems.append(f"{row.name}: unrecognised result {value[:60]!r}")
        messages.append({"level": "Info", "text": value, "gpu": None})
    test: dict[str, Any] = {
        "name": row.name,
        "category": row.category,
        "result": _aggregate(results),
        "gpus": gpus,
        "all_gpus": all_gpus,
        "messages": messages,
    }
    if code is not None:
        test["code"] = code
    return test


def _diag_result(
    fmt: str,
    tests: list[dict[str, Any]],
    section_messages: list[dict[str, Any]],
    metadata: dict[str, Any],
    runtime_error: str | None,
    complete: bool,
    problems: list[str],
) -> ParseResult:
    def meta(*keys: str) -> Any:
        for key in keys:
            for label, value in metadata.items():
                if label.lower() == key.lower() and value not in (None, ""):
                    return value
        return None

    version = meta("DCGM Version", "version")
    driver = meta("Driver Version Detected", "driver_version")
    dev_ids = meta(
        "GPU Device IDs Detected", "GPU PCI Device IDs Detected", "GPU Device IDs", "devIds"
    )
    device_ids: list[str] | None = None
    if isinstance(dev_ids, str):
        device_ids = [d.strip() for d in dev_ids.split(",") if d.strip()]
    elif isinstance(dev_ids, list):
        device_ids = [str(d) for d in dev_ids]

    summary = {word: sum(1 for t in tests if t["result"] == word) for word in RESULTS}
    errors = any(m["level"] == "Error" for m in section_messages) or any(
        m["level"] == "Error" for t in tests for m in t["messages"]
    )
    overall: str | None
    if summary["Fail"] or errors:
        overall = "Fail"
    elif not complete or not tests or runtime_error is not None:
        overall = None
    elif any(t["result"] is None for t in tests):
        overall = None
        problems.append("a test has no recognisable result: overall left unknown")
    else:
        overall = "Pass"
    data: dict[str, Any] = {
        "format": fmt,
        "version": version if isinstance(version, str) else None,
        "driver_version": driver if isinstance(driver, str) else None,
        "gpu_device_ids": device_ids,
        "metadata": metadata,
        "tests": tests,
        "section_messages": section_messages,
        "summary": summary,
        "runtime_error": runtime_error,
        "complete": complete,
        "overall": overall,
    }
    return ParseResult(kind=DIAG, recognised=True, data=data, problems=tuple(problems))


# ------------------------------------------------------------------------------------------
# dcgmi diag -j


def _json_start(text: str) -> int | None:
    """Offset of the JSON document (dcgmi may print a banner line before it)."""
    for match in re.finditer(r"(?m)^[ \t]*\{", text):
        return match.start()
    return None


def _json_messages(result: dict[str, Any], gpu: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    warnings = result.get("warnings")
    if isinstance(warnings, list):
        for warning in warnings:
            text: Any = warning
            if isinstance(warning, dict):
                text = warning.get("warning", warning.get("warnings", warning.get("message")))
            if isinstance(text, str) and text.strip():
                out.append({"level": "Warning", "text": text.strip(), "gpu": gpu})
    elif isinstance(warnings, str) and warnings.strip():
        out.append({"level": "Warning", "text": warnings.strip(), "gpu": gpu})
    info = result.get("info")
    infos = info if isinstance(info, list) else [info]
    for item in infos:
        if isinstance(item, str) and item.strip():
            out.append({"level": "Info", "text": item.strip(), "gpu": gpu})
    return out


def _json_result_ids(result: dict[str, Any]) -> list[str]:
    for key in ("gpu_id", "gpu_ids", "entity_id"):
        if key not in result:
            continue
        group = result.get("entity_group")
        if key == "entity_id" and isinstance(group, str) and group.upper() != "GPU":
            return [f"{group.lower()}:{result[key]}"]
        value = result[key]
        if isinstance(value, bool):
            return []
        if isinstance(value, int):
            return [str(value)]
        if isinstance(value, str):
            return _gpu_ids(value)
    return []


def _json_test(
    test: dict[str, Any], category: str | None, problems: list[str]
) -> dict[str, Any] | None:
    name = test.get("name")
    if not isinstance(name, str):
        problems.append("a JSON test has no name")
        return None
    gpus: dict[str, str] = {}
    statuses: list[str | None] = []
    messages: list[dict[str, Any]] = []
    results = test.get("results")
    for result in results if isinstance(results, list) else []:
        if not isinstance(result, dict):
            continue
        raw = result.get("status")
        word = _norm_result(raw) if isinstance(raw, str) else None
        if isinstance(raw, str) and word is None:
            problems.append(f"{name}: unknown status {raw[:40]!r}")
        statuses.append(word)
        ids = _json_result_ids(result)
        for gpu in ids:
            if word is not None:
                gpus[gpu] = word
        messages += _json_messages(result, ids[0] if len(ids) == 1 else None)
    summary = test.get("test_summary")
    result_word: str | None
    if isinstance(summary, dict) and isinstance(summary.get("status"), str):
        result_word = _norm_result(summary["status"])
        if result_word is None:
            problems.append(f"{name}: unknown status {summary['status'][:40]!r}")
        messages += _json_messages(summary, None)
    else:
        result_word = _aggregate(statuses)
    if result_word is None:
        problems.append(f"{name}: no result")
    return {
        "name": name,
        "category": category,
        "result": result_word,
        "gpus": gpus,
        "all_gpus": False,
        "messages": messages,
    }


def _json_device_ids(groups: Any) -> list[str]:
    """DCGM 4.x: ``entity_groups[GPU].entities[].device_id``."""
    out: list[str] = []
    for group in groups if isinstance(groups, list) else []:
        if not isinstance(group, dict) or group.get("entity_group") != "GPU":
            continue
        entities = group.get("entities")
        for entity in entities if isinstance(entities, list) else []:
            if isinstance(entity, dict) and isinstance(entity.get("device_id"), str):
                out.append(entity["device_id"])
    return out


def _parse_diag_json(text: str, start: int) -> ParseResult:
    problems: list[str] = []
    banner = text[:start].strip()
    try:
        # numbers no tool prints (5,000 digits, NaN, 1e400) decode as None: that field unknown
        doc, _end = json_raw_decode(text[start:])
    except ValueError as exc:
        if "DCGM" in text[start:]:
            problems.append(f"dcgmi diag -j output is not valid JSON (cut off?): {exc}")
            return _diag_result("json", [], [], {}, None, False, problems)
        return unrecognised(DIAG, "JSON that is not a dcgmi diag document")
    if not isinstance(doc, dict):
        return unrecognised(DIAG, "JSON that is not a dcgmi diag document")
    root: Any = None
    for key in ("DCGM GPU Diagnostic", "DCGM Diagnostic"):
        if isinstance(doc.get(key), dict):
            root = doc[key]
            break
    if root is None and ("test_categories" in doc or "tests" in doc):
        root = doc
    if not isinstance(root, dict):
        return unrecognised(DIAG, "JSON without a 'DCGM GPU Diagnostic' / 'DCGM Diagnostic' key")
    if banner and not banner.startswith("Successfully ran diagnostic"):
        problems.append(f"text before the JSON document: {banner[:120]!r}")

    metadata: dict[str, Any] = {}
    for source in (doc.get("metadata"), root.get("metadata"), root):
        if not isinstance(source, dict):
            continue
        for key, value in source.items():
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                metadata.setdefault(key, str(value))
            elif isinstance(value, list) and all(isinstance(v, str | int) for v in value):
                metadata.setdefault(key, [str(v) for v in value])
    runtime = root.get("runtime_error")
    runtime_error = runtime if isinstance(runtime, str) and runtime.strip() else None
    if runtime_error is not None:
        problems.append(f"the diagnostic did not run: {runtime_error[:200]}")

    tests: list[dict[str, Any]] = []
    categories = root.get("test_categories")
    for cat in categories if isinstance(categories, list) else []:
        if not isinstance(cat, dict):
            continue
        name = cat.get("category")
        category = name if isinstance(name, str) else None
        cat_tests = cat.get("tests")
        for test in cat_tests if isinstance(cat_tests, list) else []:
            if isinstance(test, dict):
                parsed = _json_test(test, category, problems)
                if parsed is not None:
                    tests.append(parsed)
    flat = root.get("tests")
    for test in flat if isinstance(flat, list) else []:
        if isinstance(test, dict):
            parsed = _json_test(test, None, problems)
            if parsed is not None:
                tests.append(parsed)
    if not tests and runtime_error is None:
        problems.append("the JSON document lists no tests")
    for key in ("runtime_error", "test_categories", "tests"):
        metadata.pop(key, None)
    device_ids = _json_device_ids(doc.get("entity_groups"))
    if device_ids and not any("device id" in key.lower() for key in metadata):
        metadata["GPU Device IDs"] = device_ids
    return _diag_result("json", tests, [], metadata, runtime_error, True, problems)


@parser(
    DIAG,
    description="dcgmi diag -r N (text table or -j JSON): per-test, per-GPU results",
)
def parse_dcgm_diag(text: str) -> ParseResult:
    text = clean(text)
    if not text.strip():
        return unrecognised(DIAG, "empty input")
    start = _json_start(text)
    if start is not None and not re.search(r"(?m)^\s*\|\s*Diagnostic\s*\|", text[:start]):
        return _parse_diag_json(text, start)
    return _parse_diag_text(text)


@dataclass(frozen=True, slots=True)
class DcgmTest:
    """One diagnostic test: its name, its result word (``Pass``/``Fail``/``Warn``/``Skip``;
    None: none recognisable) and its Error/Warning/Info messages, each as the evidence shows
    it (its entry in the data, ``{'level': ..., 'text': ..., 'gpu': ...}``, printed)."""

    name: str | None
    result: str | None
    messages: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DcgmDiag:
    """A ``dcgmi diag`` run as the judges read it; ``overall`` None: the output is incomplete."""

    tests: tuple[DcgmTest, ...]
    overall: str | None


def diag_of(data: Mapping[str, Any]) -> DcgmDiag:
    """The record of :func:`parse_dcgm_diag`'s data."""
    return DcgmDiag(
        tests=tuple(
            DcgmTest(
                name=test.get("name"),
                result=test.get("result"),
                messages=tuple(str(m) for m in _listed(test.get("messages"))),
            )
            for test in data.get("tests") or ()
        ),
        overall=data.get("overall"),
    )


def _listed(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, Iterable) else ()


# ------------------------------------------------------------------------------------------
# dcgmi nvlink -s

_ENTITY = re.compile(r"^(gpuId|physicalId)\s+(\d+)\s*:\s*$")
_LINK_STATES = {"U", "D", "X", "_"}


@parser(
    NVLINK,
    description="dcgmi nvlink -s: NVLink link states (U/D/X/_) per GPU and NVSwitch",
)
def parse_dcgm_nvlink(text: str) -> ParseResult:
    text = clean(text)
    if not text.strip():
        return unrecognised(NVLINK, "empty input")
    problems: list[str] = []
    gpus: dict[str, list[str] | None] = {}
    switches: dict[str, list[str] | None] = {}
    saw_title = saw_gpus = saw_switches = saw_key = no_switches = False
    section: str | None = None
    current: tuple[str, str] | None = None
    for raw in text.split("\n"):
        stripped = raw.strip()
        if not stripped:
            continue
        if "NvLink Link Status" in stripped:
            saw_title = True
            continue
        if re.fullmatch(r"\+-+\+", stripped):
            continue
        if stripped == "GPUs:":
            saw_gpus, section, current = True, "gpu", None
            continue
        if stripped == "NvSwitches:":
            saw_switches, section, current = True, "nvswitch", None
            continue
        if stripped.startswith("Key:"):
            saw_key = True
            current = None
            continue
        if stripped.startswith("No NvSwitches found"):
            no_switches = True
            continue
        entity = _ENTITY.match(stripped)
        if entity:
            kind = "gpu" if entity.group(1) == "gpuId" else "nvswitch"
            if section is not None and kind != section:
                problems.append(f"{stripped!r} under the wrong section")
            target = gpus if kind == "gpu" else switches
            target[entity.group(2)] = None
            current = (kind, entity.group(2))
            continue
        if current is not None and re.fullmatch(r"[A-Za-z_](\s+[A-Za-z_])*", stripped):
            kind, ident = current
            states = stripped.split()
            unknown = sorted({s for s in states if s not in _LINK_STATES})
            if unknown:
                problems.append(f"{kind} {ident}: unknown link state(s) {', '.join(unknown)}")
            target = gpus if kind == "gpu" else switches
            target[ident] = (target.get(ident) or []) + states
            continue
        if saw_title or gpus:
            problems.append(f"unexpected line: {stripped[:80]!r}")

    if not gpus and not (saw_title and saw_gpus):
        return unrecognised(NVLINK, "no dcgmi nvlink -s link status (no 'gpuId N:' lines)")
    for kind, table in (("gpu", gpus), ("nvswitch", switches)):
        for ident, listed in table.items():
            if listed is None:
                problems.append(f"{kind} {ident}: no link states (cut off?)")
    if not saw_title:
        problems.append("no 'NvLink Link Status' title (filtered or partial output)")
    if not gpus:
        problems.append("no GPUs listed")
    nvswitches: dict[str, list[str] | None] | None = switches
    if not saw_switches:
        problems.append("no 'NvSwitches:' section: NVSwitch states unknown")
        nvswitches = None
    elif not switches and not no_switches:
        problems.append("'NvSwitches:' section is empty (cut off?)")
        nvswitches = None
    if not saw_key and saw_switches:
        problems.append("no 'Key:' legend line at the end (cut off?)")
    not_up: list[dict[str, Any]] = []
    for kind, table in (("gpu", gpus), ("nvswitch", switches)):
        for ident, listed in table.items():
            for link, state in enumerate(listed or []):
                if state in ("D", "X"):
                    not_up.append({"entity": kind, "id": ident, "link": link, "state": state})
    data: dict[str, Any] = {"gpus": gpus, "nvswitches": nvswitches, "links_not_up": not_up}
    return ParseResult(kind=NVLINK, recognised=True, data=data, problems=tuple(problems))
