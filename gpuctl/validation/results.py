"""Verdicts and result records: what every judge returns and every report renders."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

RESULTS_SCHEMA_VERSION = 1


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

    @property
    def percent_of_limit(self) -> float | None:
        if (
            self.limit
            and isinstance(self.measured, int | float)
            and not isinstance(self.measured, bool)
        ):
            return round(100.0 * float(self.measured) / self.limit, 1)
        return None

    def to_json(self) -> dict[str, Any]:
        return {
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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        return cls(
            check=str(data["check"]),
            node=str(data["node"]),
            verdict=Verdict(data["verdict"]),
            message=str(data["message"]),
            subject=data.get("subject"),
            measured=data.get("measured"),
            expected=data.get("expected"),
            unit=data.get("unit"),
            limit=data.get("limit"),
            source=data.get("source"),
            evidence=tuple(data.get("evidence") or ()),
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
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "cluster": self.cluster,
            "level": self.level,
            "generated_at": self.generated_at,
            "summary": self.summary(),
            "nodes": [
                {
                    "node": n.node,
                    "verdict": n.verdict.value,
                    "failed": n.failed,
                    "unknown_fails": n.unknown_fails,
                    "checks": [c.to_json() for c in n.checks],
                }
                for n in self.nodes
            ],
            "extra": self.extra,
        }

    def dumps(self) -> str:
        """Compact JSON (a 1,000-node run holds ~60,000 checks; `jq .` pretty-prints it)."""
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidationReport:
        version = data.get("schema_version")
        if version != RESULTS_SCHEMA_VERSION:
            raise ValueError(f"results schema_version {version!r}; this gpuctl reads 1")
        return cls(
            cluster=str(data["cluster"]),
            level=str(data["level"]),
            generated_at=data.get("generated_at"),
            nodes=tuple(
                NodeReport(
                    node=str(n["node"]),
                    checks=tuple(CheckResult.from_json(c) for c in n["checks"]),
                    unknown_fails=bool(n.get("unknown_fails", True)),
                )
                for n in data["nodes"]
            ),
            extra=dict(data.get("extra") or {}),
        )


def by_node(results: Sequence[CheckResult]) -> dict[str, list[CheckResult]]:
    out: dict[str, list[CheckResult]] = {}
    for r in results:
        out.setdefault(r.node, []).append(r)
    return out
