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
        # result: Pass | Fail | Warn | Skip | Not Run, the worst of the test's own word and its
        # per-GPU rows (DCGM 4: "GPU5: Fail"); gpu of a message: "5" for a "Warning: GPU5" row
    section_messages: [{category, level, text}]  # Error/Warning/Info rows with no test above
    errors: [str]                    # dcgmi's own "Error: ..." lines outside the table
    summary: {"Pass": n, "Fail": n, "Warn": n, "Skip": n}
    runtime_error: str | None        # JSON "runtime_error" (the diagnostic did not run)
    complete: bool                   # header and closing border seen (text) / JSON parsed
    overall: "Pass" | "Fail" | None

Text layouts: DCGM 2.x/3.x (``Denylist`` ... Deployment rows, ``Pass - All`` /
``Fail - GPU: 0``) and DCGM 4.x (NVIDIA/DCGM dcgmi/Diag.cpp, HelperDisplayAsCli: lower-case
test names, the test's own ``Pass|Fail|Skip|Warn`` then one ``GPUn: <result>`` row per GPU, a
test-wide error as a ``Warning`` row, a GPU's error as a ``Warning: GPUn`` row after it; with
``-v`` also ``Info`` / ``Info: GPUn`` rows). Output that is only dcgmi's ``Error: ...`` (no
table; DCGM 4 prints a system error so and exits 226) is not recognised, its lines kept in
``errors``.

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
NOT_RUN = "Not Run"  # DCGM 4's word for a GPU a test did not run on (Diag.cpp)
_MESSAGE_LEVELS = {"warning": "Warning", "error": "Error", "info": "Info"}
# "Warning", "Info: GPU5", "Warning: CPU0" (DCGM 4 names the entity in the name cell)
_MESSAGE_NAME = re.compile(r"^(Warning|Error|Info)(?::\s*([A-Za-z_]+?)(\d+))?$", re.IGNORECASE)
# DCGM 4's per-entity row: "GPU0: Pass", "CPU1: Skip", "GPU3: Not Run"
_ENTITY_RESULT = re.compile(r"^([A-Za-z_]+?)(\d+):\s*(Pass|Fail|Warn|Skip|Not Run)$", re.IGNORECASE)

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
        "not run": NOT_RUN,
    }
    return table.get(low)


def _aggregate(results: Iterable[str | None]) -> str | None:
    """One result for a test from its own and its per-GPU results: Fail > Warn > Pass > Skip >
    Not Run (a test that passed on some GPUs and was skipped on others passed; the judge reads
    the skipped GPUs)."""
    seen = set(results)
    for word in ("Fail", "Warn", "Pass", "Skip", NOT_RUN):
        if word in seen:
            return word
    return None


def _entity_key(group: str, ident: str) -> str:
    """``GPU``/``5`` -> ``5``; any other entity ``cpu:0`` (as the JSON layouts name them)."""
    return ident if group.upper() == "GPU" else f"{group.lower()}:{ident}"


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
            # a wrapped chunk is 45 characters; a plain value may fill all 46 (8 device ids)
            wide = body[: width + 1]
            body = wide if len(wide.rstrip(" ")) > width else body[:width]
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
    errors: list[str] = []  # dcgmi's "Error: ..." lines outside the table, with what follows
    rows: list[_Row] = []
    category: str | None = None
    saw_header = saw_section = closed = False
    in_error = False  # the previous line outside the table was (part of) an error
    unclosed_rows = 0
    current: _Row | None = None
    headers = 0

    for raw in lines:
        line = raw.rstrip("\n").replace("\t", "    ")
        stripped = line.strip()
        if not stripped:
            in_error = False
            continue
        if _HEADER.match(stripped):
            saw_header = True
            headers += 1
            current = None
            closed = in_error = False
            continue
        if _DOUBLE.match(stripped):
            continue
        section = _SECTION.match(stripped)
        if section:
            saw_section = True
            category = section.group(1).strip()
            current = None
            closed = in_error = False
            continue
        if _BORDER.match(stripped):
            # the top border comes before anything else; a border after rows is the footer
            if rows or saw_section:
                closed = True
            current = None
            in_error = False
            continue
        cells = _split_row(line.lstrip())
        if cells is None:
            outside = closed or not (rows or saw_header)
            if stripped.startswith(("Error", "error", "ERROR")):
                errors.append(stripped)
                in_error = outside
            elif in_error and outside:
                errors[-1] += "\n" + stripped  # dcgmi prints DCGM's system errors below
            elif stripped.startswith("Successfully ran diagnostic"):
                pass
            elif rows or saw_header:
                problems.append(f"unexpected line in the diag table: {stripped[:80]!r}")
            continue
        in_error = False
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
        if errors:
            first = errors[0].replace("\n", " ")
            return unrecognised(DIAG, f"no diag table, only an error: {first[:200]}", errors=errors)
        return unrecognised(DIAG, "no dcgmi diag table (no 'Diagnostic | Result' header)")

    metadata: dict[str, str | None] = {}
    tests: list[dict[str, Any]] = []
    section_messages: list[dict[str, Any]] = []
    last_test: dict[str, Any] | None = None
    for row in rows:
        if row.category is not None and row.category.lower() == "metadata":
            value = _join_wrapped(row.chunks, row.widths)
            metadata[row.name] = value or None
            continue
        named = _MESSAGE_NAME.match(row.name)
        if named is None:
            last_test = _text_test(row, problems)
            tests.append(last_test)
            continue
        # a message row; DCGM 4 goes on with the next GPU's "GPUn: <result>" rows below it
        level = _MESSAGE_LEVELS[named.group(1).lower()]
        cut = next(
            (i for i, c in enumerate(row.chunks) if i and _ENTITY_RESULT.match(c.strip())),
            len(row.chunks),
        )
        message = {
            "level": level,
            "text": _join_wrapped(row.chunks[:cut], row.widths[:cut]),
            "gpu": _entity_key(named.group(2), named.group(3)) if named.group(2) else None,
        }
        same = last_test is not None and last_test["category"] == row.category
        # DCGM 3 prints a Deployment check's Error rows under that check's own (failed) row;
        # an Error under a check that passed is not that check's (old tools, the lab's stand-in)
        if last_test is not None and same and not (level == "Error" and _passed(last_test)):
            last_test["messages"].append(message)
        else:
            section_messages.append(
                {"category": row.category, "level": level, "text": message["text"]}
            )
        if cut < len(row.chunks):
            if last_test is None or not same:
                problems.append(f"per-GPU rows with no test above them: {row.chunks[cut]!r}")
            else:
                _entity_rows(last_test, row.chunks[cut:], problems)

    for test in tests:
        test["result"] = _aggregate([*test.pop("_words"), *test["gpus"].values()])
    if headers > 1:
        problems.append(f"{headers} diag tables (iterations?): their rows are listed together")
    if not saw_header:
        problems.append("no 'Diagnostic | Result' header: a fragment of the table")
    if unclosed_rows:
        problems.append(f"{unclosed_rows} row(s) without a closing '|': cut off")
    if not closed:
        problems.append("no closing border after the last row: the table is incomplete")
    for banner in errors:
        problems.append(f"dcgmi error: {banner.replace(chr(10), ' ')[:200]}")
    complete = saw_header and closed and unclosed_rows == 0
    if not tests and complete:
        problems.append("the table lists no tests")
    return _diag_result("text", tests, section_messages, metadata, None, complete, problems, errors)


def _passed(test: dict[str, Any]) -> bool:
    return "Pass" in test["_words"] and not {"Fail", "Warn"} & set(test["_words"])


def _is_result_row(row: _Row) -> bool:
    if not row.chunks:
        return False
    return bool(_RESULT.match(row.chunks[0].strip()))


def _entity_rows(test: dict[str, Any], chunks: list[str], problems: list[str]) -> None:
    """DCGM 4's ``GPUn: <result>`` rows into the test's ``gpus``."""
    for chunk in chunks:
        match = _ENTITY_RESULT.match(chunk.strip())
        word = _norm_result(match.group(3)) if match else None
        if match is None or word is None:
            problems.append(f"{test['name']}: unrecognised per-GPU row {chunk.strip()[:60]!r}")
            continue
        key = _entity_key(match.group(1), match.group(2))
        if key in test["gpus"]:
            problems.append(f"{test['name']}: {match.group(1)}{match.group(2)} listed twice")
        test["gpus"][key] = word


def _text_test(row: _Row, problems: list[str]) -> dict[str, Any]:
    gpus: dict[str, str] = {}
    all_gpus = False
    words: list[str | None] = []
    messages: list[dict[str, Any]] = []
    last_word: str | None = None
    code: str | None = None
    test: dict[str, Any] = {"name": row.name, "category": row.category, "result": None}
    for chunk in row.chunks:
        value = chunk.strip()
        if not value:
            continue
        match = _RESULT.match(value)
        if match:
            word = _norm_result(match.group(1))
            last_word = word
            words.append(word)
            if match.group(2):
                all_gpus = True
            elif match.group(3) is not None and word is not None:
                for gpu in _gpu_ids(match.group(3)):
                    gpus[gpu] = word
            continue
        if words and _ENTITY_RESULT.match(value):
            test["gpus"] = gpus
            _entity_rows(test, [value], problems)
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
    test.update(gpus=gpus, all_gpus=all_gpus, messages=messages, _words=words)
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
    errors: list[str] | None = None,
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
    error_rows = any(m["level"] == "Error" for m in section_messages) or any(
        m["level"] == "Error" for t in tests for m in t["messages"]
    )
    overall: str | None
    if summary["Fail"] or error_rows:
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
        "errors": errors or [],
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
class DcgmNote:
    """One Error/Warning/Info row as DCGM printed it; ``gpu``: the GPU its name cell names
    (DCGM 4 ``Warning: GPU5``), None for a test-wide one."""

    level: str
    text: str
    gpu: str | None = None


@dataclass(frozen=True, slots=True)
class DcgmTest:
    """One diagnostic test: its name, its result word (``Pass``/``Fail``/``Warn``/``Skip``/
    ``Not Run``; None: none recognisable) and its Error/Warning/Info messages, each as the
    evidence shows it (its entry in the data, ``{'level': ..., 'text': ..., 'gpu': ...}``,
    printed). ``gpus``: per GPU (or ``cpu:0`` ...) result; ``notes``: the messages as records."""

    name: str | None
    result: str | None
    messages: tuple[str, ...]
    category: str | None = None
    gpus: tuple[tuple[str, str], ...] = ()
    notes: tuple[DcgmNote, ...] = ()


@dataclass(frozen=True, slots=True)
class DcgmDiag:
    """A ``dcgmi diag`` run as the judges read it; ``overall`` None: the output is incomplete.
    ``orphans``: Error/Warning/Info rows under no test (with their section); ``errors``:
    dcgmi's own ``Error: ...`` lines outside the table; ``complete``: the whole table."""

    tests: tuple[DcgmTest, ...]
    overall: str | None
    version: str | None = None
    complete: bool = False
    orphans: tuple[tuple[str | None, DcgmNote], ...] = ()
    errors: tuple[str, ...] = ()


def _note(entry: Any) -> DcgmNote | None:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("text"), str):
        return None
    gpu = entry.get("gpu")
    return DcgmNote(
        str(entry.get("level") or "Info"), entry["text"], gpu if isinstance(gpu, str) else None
    )


def diag_of(data: Mapping[str, Any]) -> DcgmDiag:
    """The record of :func:`parse_dcgm_diag`'s data."""
    tests = []
    for test in data.get("tests") or ():
        gpus = test.get("gpus")
        tests.append(
            DcgmTest(
                name=test.get("name"),
                result=test.get("result"),
                messages=tuple(str(m) for m in _listed(test.get("messages"))),
                category=test.get("category"),
                gpus=tuple((str(k), str(v)) for k, v in gpus.items())
                if isinstance(gpus, Mapping)
                else (),
                notes=tuple(n for n in map(_note, _listed(test.get("messages"))) if n),
            )
        )
    orphans = []
    for entry in _listed(data.get("section_messages")):
        note = _note(entry)
        if note is not None:
            category = entry.get("category")
            orphans.append((category if isinstance(category, str) else None, note))
    version = data.get("version")
    return DcgmDiag(
        tests=tuple(tests),
        overall=data.get("overall"),
        version=version if isinstance(version, str) else None,
        complete=data.get("complete") is True,
        orphans=tuple(orphans),
        errors=tuple(str(e) for e in _listed(data.get("errors"))),
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
