"""Verdicts and result records: what every judge returns and every report renders.

Also the two rules every report follows. :func:`printable` is the one sanitiser of text a
report shows (a message can carry whatever a job wrote into the kernel log), and
:func:`loads_results` reads a results.json strictly: anything gpuctl would not have written is
:class:`NotResults`, with the place it was found, never a crash further on.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

RESULTS_SCHEMA_VERSION = 1

# ------------------------------------------------------------------------------------------
# Text every report can carry

# C0 controls but tab and newline, DEL, C1 (NEL U+0085 among them), the Arabic letter mark,
# LRM/RLM, the line and paragraph separators, bidi embeddings/overrides/isolates, surrogates
# (a lone one cannot be written as UTF-8), the BOM and the two non-characters XML refuses.
_UNSAFE = (
    r"\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
    r"\ud800-\udfff\ufeff\ufffe\uffff"
)
_UNSAFE_TEXT = re.compile(f"[{_UNSAFE}]")
_UNSAFE_LINE = re.compile(rf"[\t\n{_UNSAFE}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, multiline: bool = False) -> str:
    """``text`` safe for every report and terminal: each control character (and each character
    that changes how the text around it is shown: bidi overrides, U+2028) is replaced by its
    escape, ``\\x1b`` for ESC, so it stays visible and can do nothing. ``multiline`` keeps
    newline and tab (text inside an element); otherwise they are escaped too (one line).

    Idempotent: what it returns passes through it unchanged."""
    if text.isascii() and text.isprintable():  # nearly every string: no regex
        return text
    return (_UNSAFE_TEXT if multiline else _UNSAFE_LINE).sub(_escaped, text)


def json_value(value: Any) -> Any:
    """``value`` as results.json stores it: strings :func:`printable` (newlines kept), a
    non-finite float null (JSON has no NaN), tuples as lists. What needs no change is returned
    as it is, tested a table or a row at a time (a 1,024-node report holds ~250,000 words)."""
    if isinstance(value, str):
        return printable(value, multiline=True)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        if _plain_words(value.keys()) and (
            _plain_words(value.values())
            or _plain_numbers(value.values())
            or _plain_table(value.values())
        ):
            return value
        return {
            printable(k, multiline=True) if isinstance(k, str) else k: json_value(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        if _plain_numbers(value) or _plain_words(value) or _plain_rows(value):
            return list(value)
        return [json_value(v) for v in value]
    return value


def _plain_words(items: Iterable[Any]) -> bool:
    """Whether every item is a string and none needs :func:`printable` (one test for all)."""
    try:
        joined = "".join(items)
    except TypeError:  # not all strings
        return False
    return joined.isascii() and joined.isprintable()


def _plain_numbers(items: Iterable[Any]) -> bool:
    """Whether every item is a finite number (or a boolean): their sum is then finite."""
    try:
        return math.isfinite(sum(items))
    except (TypeError, OverflowError):  # not all numbers, or an int beyond float
        return False


def _plain_rows(items: Sequence[Any]) -> bool:
    """Whether every item is a list of finite numbers (a curve: [[size, busbw], ...])."""
    if not all(type(row) is list for row in items):
        return False
    try:
        return math.isfinite(sum(map(sum, items)))
    except (TypeError, OverflowError):
        return False


def _plain_table(rows: Iterable[Any]) -> bool:
    """Whether every item is an object of words to words (a topology matrix)."""
    return all(
        type(row) is dict and _plain_words(row) and _plain_words(row.values()) for row in rows
    )


_SCALARS = frozenset({str, int, float, bool})


_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*")


def is_host_name(name: str) -> bool:
    """A host name (RFC 1123 labels, and ``_`` as Slurm allows): what may stand for a node in
    a report, a drain-reasons line or an scontrol argument."""
    return len(name) <= 253 and _HOST.fullmatch(name) is not None


class Verdict(StrEnum):
    """Ordered from best to worst; the numbers follow Nagios (0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN)."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"

    @property
    def code(self) -> int:
        return _CODES[self]


_CODES = {Verdict.OK: 0, Verdict.WARN: 1, Verdict.FAIL: 2, Verdict.UNKNOWN: 3}
# How bad a verdict is for a node: UNKNOWN (could not tell) ranks with FAIL, above WARN.
_SEVERITY = {Verdict.OK: 0, Verdict.WARN: 1, Verdict.UNKNOWN: 2, Verdict.FAIL: 3}


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One judged fact about one node (or one GPU, port, link of it)."""

    check: str  # stable id, e.g. "gpu.count", "ib.port.rate", "nccl.busbw"
    node: str
    verdict: Verdict
    message: str
    subject: str | None = None  # "GPU3", "mlx5_0/1", "GPU0-GPU1"
    measured: Any = None
    expected: Any = None
    unit: str | None = None
    limit: float | None = None  # the physical limit (line rate, link bandwidth), same unit
    source: str | None = None  # where the expected value comes from
    evidence: tuple[str, ...] = ()  # the lines of tool output that led to this verdict

    def __post_init__(self) -> None:
        # NaN compares false with everything, so a judge would pass it: a number that is not
        # finite is never OK (nor WARN, which passes too); it could not be measured
        if self.verdict is not Verdict.OK and self.verdict is not Verdict.WARN:
            return
        measured, expected, limit = self.measured, self.expected, self.limit
        if (
            (not isinstance(measured, float) or math.isfinite(measured))
            and (not isinstance(expected, float) or math.isfinite(expected))
            and (not isinstance(limit, float) or math.isfinite(limit))
        ):
            return
        name, value = next(
            (name, value)
            for name, value in (("measured", measured), ("expected", expected), ("limit", limit))
            if isinstance(value, float) and not math.isfinite(value)
        )
        object.__setattr__(self, "verdict", Verdict.UNKNOWN)
        object.__setattr__(self, "message", f"{self.message} ({name} {value}: not a finite number)")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its fields, read back through ``__init__`` (a worker process returns
        ~140 per node): faster both ways than a frozen dataclass's state, set field by field."""
        return (
            CheckResult,
            (
                self.check,
                self.node,
                self.verdict,
                self.message,
                self.subject,
                self.measured,
                self.expected,
                self.unit,
                self.limit,
                self.source,
                self.evidence,
            ),
        )

    @property
    def percent_of_limit(self) -> float | None:
        measured, limit = self.measured, self.limit
        if not limit or not isinstance(measured, int | float) or isinstance(measured, bool):
            return None
        try:
            if not math.isfinite(limit):
                return None
            percent = round(100.0 * float(measured) / limit, 1)
        except (OverflowError, ValueError):  # an int beyond float, or an infinite result
            return None
        return percent if math.isfinite(percent) else None

    def to_json(self) -> dict[str, Any]:
        """The check as results.json holds it: text :func:`printable`, NaN and infinity null."""
        data = {
            "check": self.check,
            "node": self.node,
            "subject": self.subject,
            "verdict": self.verdict.value,
            "measured": self.measured,
            "expected": self.expected,
            "unit": self.unit,
            "limit": self.limit,
            "percent_of_limit": self.percent_of_limit,
            "source": self.source,
            "message": self.message,
            "evidence": list(self.evidence),
        }
        return data if self._plain() else json_value(data)

    def _plain(self) -> bool:
        """Whether :meth:`to_json` has nothing to clean: all text printable ASCII on one line
        (tested in one go: 66,000 checks in a 1,024-node run), every value a finite number, a
        string or null."""
        measured, expected, limit = self.measured, self.expected, self.limit
        kind_m, kind_e = type(measured), type(expected)
        try:
            joined = "".join(
                (
                    self.check,
                    self.node,
                    self.message,
                    self.subject or "",
                    self.unit or "",
                    self.source or "",
                    measured if kind_m is str else "",
                    expected if kind_e is str else "",
                    *self.evidence,
                )
            )
        except TypeError:  # a field that is not text: the slow way
            return False
        return (
            joined.isascii()
            and joined.isprintable()
            and (measured is None or kind_m in _SCALARS)
            and (expected is None or kind_e in _SCALARS)
            and (kind_m is not float or math.isfinite(measured))
            and (kind_e is not float or math.isfinite(expected))
            and (not isinstance(limit, float) or math.isfinite(limit))
        )

    @classmethod
    def from_json(cls, data: Any, where: str = "check") -> CheckResult:
        """Read a check as :meth:`to_json` writes it; :class:`NotResults` (at ``where``) for
        anything else."""
        doc = _object(data, where)
        verdict = _required(doc, "verdict", where)
        if not isinstance(verdict, str) or verdict not in _VERDICTS:
            raise NotResults(
                f"{where}.verdict: {_shown(verdict)} is not a verdict (ok, warn, fail, unknown)"
            )
        evidence = doc.get("evidence") or []
        if not (isinstance(evidence, list) and _all_unicode(evidence)):
            lines = _list(evidence, where, "evidence")
            evidence = [_text(line, f"{where}.evidence", i) for i, line in enumerate(lines)]
        return cls(
            check=_text(_required(doc, "check", where), where, "check"),
            node=_host(_required(doc, "node", where), where, "node"),
            verdict=_VERDICTS[verdict],
            message=_text(_required(doc, "message", where), where, "message"),
            subject=_optional_text(doc.get("subject"), where, "subject"),
            measured=_json(doc.get("measured"), where, "measured"),
            expected=_json(doc.get("expected"), where, "expected"),
            unit=_optional_text(doc.get("unit"), where, "unit"),
            limit=_number(doc.get("limit"), where, "limit"),
            source=_optional_text(doc.get("source"), where, "source"),
            evidence=tuple(evidence),
        )


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst verdict; no verdict at all is UNKNOWN (nothing was checked)."""
    found = list(verdicts)
    if not found:
        return Verdict.UNKNOWN
    return max(found, key=lambda v: _SEVERITY[v])


@dataclass(frozen=True, slots=True)
class NodeReport:
    node: str
    checks: tuple[CheckResult, ...]
    unknown_fails: bool = True

    @property
    def verdict(self) -> Verdict:
        return worst(c.verdict for c in self.checks)

    @property
    def failed(self) -> bool:
        """A node fails on FAIL, and on UNKNOWN unless the user said otherwise (fail closed)."""
        v = self.verdict
        return v is Verdict.FAIL or (v is Verdict.UNKNOWN and self.unknown_fails)

    def problems(self) -> list[CheckResult]:
        bad = {Verdict.FAIL, Verdict.UNKNOWN} if self.unknown_fails else {Verdict.FAIL}
        return [c for c in self.checks if c.verdict in bad]


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """Everything one validation run found, ready for the JSON/JUnit/HTML/Prometheus writers."""

    cluster: str
    level: str
    nodes: tuple[NodeReport, ...]
    generated_at: str | None = None  # ISO time, given by the caller (reports stay deterministic)
    extra: dict[str, Any] = field(default_factory=dict)  # topology matrices, curves for the HTML

    def summary(self) -> dict[str, int]:
        counts = Counter(n.verdict.value for n in self.nodes)
        return {
            "nodes": len(self.nodes),
            "failed": sum(1 for n in self.nodes if n.failed),
            **{v.value: counts.get(v.value, 0) for v in Verdict},
        }

    @property
    def failed(self) -> bool:
        return any(n.failed for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        generated_at = self.generated_at
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "cluster": printable(self.cluster, multiline=True),
            "level": printable(self.level, multiline=True),
            "generated_at": None if generated_at is None else printable(generated_at),
            "summary": self.summary(),
            "nodes": [
                {
                    "node": printable(n.node, multiline=True),
                    "verdict": n.verdict.value,
                    "failed": n.failed,
                    "unknown_fails": n.unknown_fails,
                    "checks": [c.to_json() for c in n.checks],
                }
                for n in self.nodes
            ],
            "extra": json_value(self.extra),
        }

    def dumps(self) -> str:
        """Compact JSON (a 1,000-node run holds ~60,000 checks; `jq .` pretty-prints it)."""
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, data: Any) -> ValidationReport:
        """Read what :meth:`to_json` writes; :class:`NotResults` for anything else (a field
        of the wrong type, a verdict that is not one, a node name that is not a host name, a
        lone surrogate, a number that is not finite, nesting deeper than gpuctl writes)."""
        if not isinstance(data, dict):
            raise NotResults(f"the top level is {_kind(data)}, not an object")
        version = data.get("schema_version")
        if type(version) is not int or version != RESULTS_SCHEMA_VERSION:
            raise NotResults(
                f"results schema_version {_shown(version)}; this gpuctl reads "
                f"{RESULTS_SCHEMA_VERSION}"
            )
        cluster = _text(_required(data, "cluster", ""), "", "cluster")
        level = _text(_required(data, "level", ""), "", "level")
        generated_at = _optional_text(data.get("generated_at"), "", "generated_at")
        nodes: list[NodeReport] = []
        for i, item in enumerate(_list(_required(data, "nodes", ""), "", "nodes")):
            where = f"nodes[{i}]"
            node = _object(item, where)
            unknown_fails = node.get("unknown_fails", True)
            if not isinstance(unknown_fails, bool):
                raise NotResults(
                    f"{where}.unknown_fails: {_kind(unknown_fails)}, expected a boolean"
                )
            checks = _list(_required(node, "checks", where), where, "checks")
            nodes.append(
                NodeReport(
                    node=_host(_required(node, "node", where), where, "node"),
                    checks=tuple(
                        CheckResult.from_json(c, f"{where}.checks[{j}]")
                        for j, c in enumerate(checks)
                    ),
                    unknown_fails=unknown_fails,
                )
            )
        return cls(
            cluster=cluster,
            level=level,
            generated_at=generated_at,
            nodes=tuple(nodes),
            extra=_extra(data.get("extra")),
        )


# ------------------------------------------------------------------------------------------
# Reading results.json strictly


class NotResults(ValueError):
    """A document gpuctl would not have written as results.json; the message says where
    (``nodes[3].checks[0].verdict: ...``) on one line."""


_VERDICTS = {v.value: v for v in Verdict}
MAX_DEPTH = 32  # gpuctl nests 6 levels deep; a value deeper than this is not its own


def loads_results(raw: bytes | str) -> ValidationReport:
    """The report of a results.json's bytes; :class:`NotResults` when they are not UTF-8,
    not JSON (NaN and Infinity included) or not what gpuctl writes."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            byte = raw[exc.start]
            raise NotResults(f"not UTF-8 (byte 0x{byte:02x} at offset {exc.start})") from None
    else:
        text = raw
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except NotResults:
        raise
    except json.JSONDecodeError as exc:
        raise NotResults(f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise NotResults(f"not JSON: {str(exc).split(':', 1)[0]}") from None
    except RecursionError:
        raise NotResults("nested too deeply") from None
    return ValidationReport.from_json(data)


def _no_constant(name: str) -> Any:
    raise NotResults(f"not JSON: {name} is not a number JSON allows")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _shown(value: Any, limit: int = 64) -> str:
    """``value`` quoted for an error message: one line, control characters escaped."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + "..."
    return printable(repr(value)[: limit + 2])


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")


def _path(where: str, key: str | int | None = None) -> str:
    """Where a value is, for an error message (built only when there is one to give):
    ``nodes[3].checks[0].verdict``; a key that is not a plain word is quoted."""
    if key is None:
        return where
    if isinstance(key, int):
        return f"{where}[{key}]"
    shown = key if _PLAIN_KEY.fullmatch(key) else _shown(key, 32)
    return f"{where}.{shown}" if where else shown


def _required(doc: dict[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise NotResults(f"{_path(where, key)}: missing")
    return doc[key]


def _object(value: Any, where: str, key: str | int | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NotResults(f"{_path(where, key)}: {_kind(value)}, expected an object")
    return value


def _list(value: Any, where: str, key: str | int | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise NotResults(f"{_path(where, key)}: {_kind(value)}, expected a list")
    return value


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _unicode(text: str) -> bool:
    """Whether ``text`` is Unicode text: no lone surrogate (JSON's ``\\ud800`` escape)."""
    return text.isascii() or _SURROGATE.search(text) is None


def _all_unicode(items: Iterable[Any]) -> bool:
    """Whether every item is a string without a lone surrogate (tested in one go)."""
    try:
        return _unicode("".join(items))
    except TypeError:  # not all strings
        return False


def _all_finite(items: Iterable[Any]) -> bool:
    """Whether every item is a finite number or a boolean (tested in one go)."""
    try:
        return math.isfinite(sum(items))
    except (TypeError, OverflowError):
        return False


def _text(value: Any, where: str, key: str | int | None = None) -> str:
    if not isinstance(value, str):
        raise NotResults(f"{_path(where, key)}: {_kind(value)}, expected a string")
    if not _unicode(value):
        raise NotResults(f"{_path(where, key)}: a lone surrogate (not Unicode text)")
    return value


def _optional_text(value: Any, where: str, key: str | int | None = None) -> str | None:
    return None if value is None else _text(value, where, key)


@functools.lru_cache(maxsize=8192)
def _known_host(name: str) -> bool:
    return is_host_name(name)


def _host(value: Any, where: str, key: str | int | None = None) -> str:
    name = _text(value, where, key)
    if not _known_host(name):
        raise NotResults(f"{_path(where, key)}: node name {_shown(name)} is not a host name")
    return name


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _number(value: Any, where: str, key: str | int | None = None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NotResults(f"{_path(where, key)}: {_kind(value)}, expected a number")
    if not _finite(value):
        raise NotResults(f"{_path(where, key)}: not a finite number")
    return value


def _json(value: Any, where: str, key: str | int | None = None) -> Any:
    """A JSON value as gpuctl writes one: text without lone surrogates, finite numbers, at
    most MAX_DEPTH levels deep. Tested fast; walked again for the place only when it is not."""
    if _valid(value):
        return value
    at = _path(where, key)
    _locate(value, at, at, 0)
    raise NotResults(f"{at}: not JSON as gpuctl writes it")  # pragma: no cover - _locate raises


def _valid(value: Any, depth: int = 0) -> bool:
    if isinstance(value, str):
        return _unicode(value)
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return _finite(value)
    if depth >= MAX_DEPTH:
        return False
    if isinstance(value, list):
        items: Iterable[Any] = value
    elif isinstance(value, dict):
        if not _all_unicode(value):
            return False
        items = value.values()
    else:
        return False
    return _all_unicode(items) or _all_finite(items) or all(_valid(v, depth + 1) for v in items)


def _locate(value: Any, where: str, root: str, depth: int) -> None:
    """Raise NotResults at the first place in ``value`` :func:`_valid` refuses."""
    if isinstance(value, str):
        _text(value, where)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _number(value, where)
    elif isinstance(value, list | dict) and depth >= MAX_DEPTH:
        raise NotResults(f"{root}: nested deeper than {MAX_DEPTH} levels")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _locate(item, _path(where, i), root, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not _unicode(key):
                raise NotResults(f"{where}: a key with a lone surrogate (not Unicode text)")
            _locate(item, _path(where, key), root, depth + 1)
    elif value is not None and not isinstance(value, bool):
        raise NotResults(f"{where}: {_kind(value)}, not JSON")


def _extra(value: Any) -> dict[str, Any]:
    """``extra`` as the suite writes it; the parts the HTML report draws are checked by shape."""
    if value is None:
        return {}
    extra = _object(value, "extra")
    for key, item in extra.items():
        if not _unicode(key):
            raise NotResults("extra: a key with a lone surrogate (not Unicode text)")
        _json(item, "extra", key)
    for key in ("nccl_threshold", "ib_write_bw_threshold", "ib_line_rate"):
        _number(extra.get(key), "extra", key)
    for node, topo in _object(extra.get("topology") or {}, "extra", "topology").items():
        where = _path("extra.topology", node)
        doc = _object(topo, where)
        devices = _list(doc.get("devices") or [], where, "devices")
        if not _all_unicode(devices):
            for i, device in enumerate(devices):
                _text(device, f"{where}.devices", i)
        for dev, row in _object(doc.get("links") or {}, where, "links").items():
            tokens = _object(row, f"{where}.links", dev)
            if not _all_unicode(tokens.values()):
                for other, token in tokens.items():
                    _text(token, _path(f"{where}.links", dev), other)
    for node, curve in _object(extra.get("nccl") or {}, "extra", "nccl").items():
        where = _path("extra.nccl", node)
        for i, point in enumerate(_list(curve, where)):
            pair = _list(point, where, i)
            if len(pair) != 2 or not _all_finite(pair):
                if len(pair) != 2:
                    raise NotResults(f"{where}[{i}]: a list of {len(pair)}, expected [size, busbw]")
                for j, number in enumerate(pair):
                    if _number(number, f"{where}[{i}]", j) is None:
                        raise NotResults(f"{where}[{i}][{j}]: null, expected a number")
    for node, hcas in _object(extra.get("ib_write_bw") or {}, "extra", "ib_write_bw").items():
        where = _path("extra.ib_write_bw", node)
        rates = _object(hcas, where)
        if not _all_finite(rates.values()):
            for hca, gbps in rates.items():
                if _number(gbps, where, hca) is None:
                    raise NotResults(f"{_path(where, hca)}: null, expected a number")
    return dict(extra)


def by_node(results: Sequence[CheckResult]) -> dict[str, list[CheckResult]]:
    out: dict[str, list[CheckResult]] = {}
    for r in results:
        out.setdefault(r.node, []).append(r)
    return out
