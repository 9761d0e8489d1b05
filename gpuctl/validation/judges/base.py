"""What every judge shares: the probe outputs it reads, the evidence of one node, the result
helpers, and :class:`Judge`, the registry entry a judge declares itself with.

Fail closed everywhere: a probe that did not run, timed out, exited with an error, or whose
output was not recognised gives UNKNOWN for what it should have shown, never OK. A value the
output does not show is never taken as zero.

Numbers no hardware produces never pass (a bundle is text anyone can write): a measurement above
the physical limit of its link (gpuctl/data/limits.yml, gpu_models.yml, fabrics.yml; plus a
small tolerance) is FAIL, and so is one that is not a finite number; no other row is judged in
its place. A GPU or HCA listed twice in one node's evidence is FAIL and counted once. Nothing a
judge returns holds NaN or infinity.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar, cast

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.parsing import ParseResult, parse
from gpuctl.validation.plausible import finite, not_finite
from gpuctl.validation.probes import collects, parser_of
from gpuctl.validation.results import CheckResult, Verdict


@dataclass(frozen=True, slots=True)
class ProbeOutput:
    """What running one probe on one node gave: its output, or why there is none."""

    kind: str
    text: str | None
    rc: int | None = 0
    timed_out: bool = False
    error: str | None = None  # could not run (unreachable, command missing, ...)
    # gpuctl's clock (UTC seconds) when the command was sent and when its end came back
    # (meta.json sent_at / received_at); None where not recorded or not believable
    ran: tuple[float, float] | None = None
    _parsed: dict[str, ParseResult] = field(default_factory=dict, repr=False, compare=False)

    def parse_as(self, kind: str) -> ParseResult:
        """Parse the text once per kind (several judges read the same output)."""
        if kind not in self._parsed:  # "nvlink-errors.end" is parsed as nvlink-errors
            self._parsed[kind] = parse(parser_of(kind), self.text or "")
        return self._parsed[kind]

    def failure(self) -> str | None:
        """Why this output cannot be trusted, or None."""
        if self.error:
            return self.error
        if self.timed_out:
            return "timed out"
        if self.text is None:
            return "no output"
        return None


Outputs = Mapping[str, ProbeOutput]


@dataclass(frozen=True, slots=True, eq=False)
class Evidence(Mapping[str, ProbeOutput]):
    """Everything judged about one node: its probe outputs by kind (this mapping), the
    client-side ib_write_bw output per HCA, and how the node is judged: ``now`` ends the Xid
    window, ``clock_problem`` says why no collection time can be trusted, ``pairs=False``
    leaves out what needs a second node (ib_write_bw)."""

    outputs: Outputs
    ib_write_bw: Mapping[str, ProbeOutput] = field(default_factory=dict)
    now: datetime | None = None
    clock_problem: str | None = None
    pairs: bool = True

    def __getitem__(self, kind: str) -> ProbeOutput:
        return self.outputs[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)


JudgeFn = Callable[[NodeExpectation, Evidence], list[CheckResult]]


@dataclass(frozen=True, slots=True)
class Judge:
    """A node judge as the registry (:data:`gpuctl.validation.judges.NODE_JUDGES`) holds it:
    the function, the probe kinds it reads, and which nodes it applies to (by default: where a
    probe of one of those kinds runs, :func:`gpuctl.validation.probes.collects`)."""

    fn: JudgeFn
    reads: tuple[str, ...]
    applies: Callable[[NodeExpectation], bool]

    @property
    def name(self) -> str:
        return self.fn.__name__

    def __call__(self, exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
        """The node's results; none where the judge does not apply. ``outputs``: an
        :class:`Evidence`, or plain outputs by kind (judged with the defaults)."""
        if not self.applies(exp):
            return []
        evidence = outputs if isinstance(outputs, Evidence) else Evidence(outputs)
        return self.fn(exp, evidence)


def node_judge(
    *reads: str, applies: Callable[[NodeExpectation], bool] | None = None
) -> Callable[[JudgeFn], Judge]:
    """Declare a node judge and the probe kinds it reads (the first usable one counts)."""

    def collected(exp: NodeExpectation) -> bool:
        return any(collects(exp, kind) for kind in reads)

    def declare(fn: JudgeFn) -> Judge:
        return Judge(fn, reads, applies or collected)

    return declare


R = TypeVar("R")

# The records of a parse that more than one judge reads (nvidia-smi's GPUs: four; lspci's
# devices, nvbandwidth's runs, ibstat's adapters, the kernel log: two or three), each built once.
# Keyed by the parse's identity: the entry holds the parse, so that no other object gets its id
# while the entry is here, and a parse is never changed once made. Bounded: the oldest entry
# goes first (a node's judges read what they share within the node's pass).
_RECORDS: dict[tuple[int, Callable[..., Any]], tuple[ParseResult, Any]] = {}
_RECORDS_MAX = 64


def record(result: ParseResult, build: Callable[[dict[str, Any]], R]) -> R:
    """``build(result.data)``, made once per parse: ``build`` is a parser's record function
    (``smi_of``, ``pci_devices_of`` ...), which leaves the data as it is; what it returns is
    read, never changed."""
    key = (id(result), build)
    hit = _RECORDS.get(key)
    if hit is not None and hit[0] is result:
        return cast(R, hit[1])
    made = build(result.data)
    if len(_RECORDS) >= _RECORDS_MAX:
        del _RECORDS[next(iter(_RECORDS))]
    _RECORDS[key] = (result, made)
    return made


def finding(
    exp: NodeExpectation, check: str, verdict: Verdict, message: str, **kw: Any
) -> CheckResult:
    if kw:
        verdict, message = _finite_fields(kw, verdict, message)
    return CheckResult(check=check, node=exp.node, verdict=verdict, message=message, **kw)


def _finite_fields(kw: dict[str, Any], verdict: Verdict, message: str) -> tuple[Verdict, str]:
    """The last guard before a result: a non-finite measured/expected/limit becomes None (the
    verdict no better than UNKNOWN), and so does a measurement whose percentage of the limit
    would overflow. The judges check their numbers first; this catches what they missed."""
    for key in _NUMERIC_FIELDS:
        if key in kw and not_finite(kw[key]):
            kw[key] = None
            message += f"; {key} is not a finite number"
            if verdict in (Verdict.OK, Verdict.WARN):
                verdict = Verdict.UNKNOWN
    if kw.get("limit"):
        limit, measured = finite(kw["limit"]), finite(kw.get("measured"))
        if limit and measured is not None and not math.isfinite(100.0 * measured / limit):
            kw["measured"] = None
    return verdict, message


_NUMERIC_FIELDS = ("measured", "expected", "limit")


def usable_parse(
    exp: NodeExpectation, outputs: Outputs, kinds: Sequence[str], check: str
) -> tuple[ParseResult | None, list[CheckResult]]:
    """The first usable parse among ``kinds`` (preferred first), or an UNKNOWN saying why not."""
    reasons: list[str] = []
    for kind in kinds:
        out = outputs.get(kind)
        if out is None:
            continue
        why = out.failure()
        if why is not None:
            reasons.append(f"{kind}: {why}")
            continue
        result = out.parse_as(kind)
        if not result.recognised:
            # "command not found" (127) and other failed starts print nothing usable
            exited = f"exit code {out.rc}, " if out.rc not in (0, None) else ""
            problems = "; ".join(result.problems)[:200]
            reasons.append(f"{kind}: {exited}output not recognised ({problems})")
            continue
        if out.rc not in (0, None):
            reasons.append(f"{kind}: exit code {out.rc}")
            # keep going: partial output with an error exit is judged, but never OK alone
            return result, [
                finding(
                    exp, check, Verdict.UNKNOWN, f"{kind} exited with {out.rc}; output incomplete"
                )
            ]
        return result, []
    if not reasons:
        reasons.append(f"not collected ({' or '.join(kinds)})")
    return None, [finding(exp, check, Verdict.UNKNOWN, "; ".join(reasons))]


def listed_twice(
    exp: NodeExpectation,
    gpus: Sequence[Mapping[str, Any]],
    repeats: Mapping[int, tuple[int, str, Any]],
    *,
    where: str = "",
    tail: str = "",
    by_position: bool = False,
) -> list[CheckResult]:
    """A ``gpu.duplicate`` FAIL for each GPU that repeats an earlier one (:func:`first_seen`);
    ``by_position``: a GPU without an index is named by its position in the listing."""

    def name(i: int) -> str:
        return f"GPU{gpus[i].get('index', i) if by_position else gpus[i].get('index')}"

    return [
        finding(
            exp,
            "gpu.duplicate",
            Verdict.FAIL,
            f"{name(i)} is listed twice{where}: same {label} {value} as {name(first)}{tail}",
            subject=name(i),
            expected="each GPU once",
        )
        for i, (first, label, value) in sorted(repeats.items())
    ]


def threshold_value(value: Any, limit: float | None) -> float | None:
    """A threshold as a number: given directly, or as a share of the physical limit ("90%")."""
    if isinstance(value, str) and value.endswith("%"):
        share = finite(float(value[:-1])) if value[:-1].replace(".", "", 1).isdigit() else None
        return round(share / 100.0 * limit, 3) if share is not None and limit else None
    return finite(value)


def with_subject(result: CheckResult, subject: str) -> CheckResult:
    return dataclasses.replace(result, subject=subject)
