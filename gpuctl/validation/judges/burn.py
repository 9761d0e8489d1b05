"""The burn loop's verdicts (level burn, :mod:`gpuctl.validation.burn`; rules data/burn.yml).

- ``burn.duration``: the loop ran for the duration asked for (its first command sent to its
  last one back, gpuctl's clock); a loop stopped short is UNKNOWN, not a pass.
- ``burn.samples``, per GPU: dmon printed at least ``min_samples_pct`` of the samples asked for.
- ``burn.throttle``, per GPU: the clock event counters of ``nvidia-smi -q`` before and after the
  loop; time added to HW thermal slowdown, SW thermal slowdown or HW power brake fails (SW power
  capping is what DCGM's power test drives the GPUs into: shown, not failed). A driver without
  the counters (before R535) is judged on dmon's thermal violation flag (``tviol``), where shown.
- ``burn.thermal``, per GPU: dmon's hottest sample against the slowdown temperature nvidia-smi
  reports for the GPU (GPUs that report only T.Limit temperatures are judged by the counters).
- ``burn.dcgm``, per stress run: DCGM's targeted_stress or targeted_power passed on every GPU.
- ``burn.nccl``, per all_reduce run: no errors or wrong results, busbw at the node's floor;
  ``burn.nccl.drift``: no run more than ``nccl_drift_max_pct`` below the best earlier run.
- ``burn.xid``: no Xid (and no GPU fallen off the bus) in the kernel log after the loop that
  the log before the tests did not already hold.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuctl.validation import burn
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, ProbeOutput, finding, node_judge, record
from gpuctl.validation.judges.dcgm import DCGMI_EXIT, canonical
from gpuctl.validation.parsers.dcgm import diag_of
from gpuctl.validation.parsers.dmon import Dmon, dmon_of, merge_dmon
from gpuctl.validation.parsers.kernel import kernel_log_of
from gpuctl.validation.parsers.nccl import nccl_run_of
from gpuctl.validation.parsers.nvsmi_gpu import SmiRecord, smi_of
from gpuctl.validation.plausible import finite
from gpuctl.validation.results import CheckResult, Verdict

# clock event reasons whose time fails a burn (the GPU protected itself: heat, power brake)
_FAILING = {
    "hw_thermal_slowdown": "HW thermal slowdown",
    "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_power_brake": "HW power brake",
}
_LOOP_SHARE = 0.95  # of the duration: the loop ends at the deadline, never much before


def _usable(out: ProbeOutput | None) -> str | None:
    """Why an output of the loop cannot be judged, or None."""
    if out is None:
        return "not collected"
    why = out.failure()
    if why is not None:
        return why
    if not out.parse_as(out.kind).recognised:
        return "output not recognised"
    return None


def _cycles(outputs: Outputs, prefix: str) -> list[tuple[int, ProbeOutput]]:
    found = []
    for kind, out in outputs.items():
        cycle = burn.cycle_of(kind)
        if cycle is not None and kind.startswith(prefix):
            found.append((cycle, out))
    return sorted(found, key=lambda c: c[0])


@node_judge(burn.DMON_KIND)
def judge_burn(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    if not exp.burn_s:
        return [
            finding(
                exp,
                "burn.duration",
                Verdict.UNKNOWN,
                f"{burn.DMON_KIND}: the burn's duration is not known (bundle.json records "
                "no burn_s): not judged",
            )
        ]
    out: list[CheckResult] = []
    out += _duration(exp, outputs)
    dmon = _dmon(exp, outputs, out)
    smi = _smi(outputs.get(burn.SMI_START)), _smi(outputs.get(burn.SMI_END))
    out += _throttle(exp, smi[0], smi[1], outputs, dmon)
    if dmon is not None:
        out += _thermal(exp, dmon, smi[0])
    out += _dcgm(exp, outputs)
    if exp.gpu_count > 1:
        out += _nccl(exp, outputs)
    out += _xid(exp, outputs)
    return out


def _duration(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    asked = exp.burn_s or 0
    runs = [o for _, o in _cycles(outputs, "dcgm-diag")] + [o for _, o in _cycles(outputs, "nccl")]
    times = [o.ran for o in runs if o.ran is not None]
    if not times:
        return [finding(exp, "burn.duration", Verdict.UNKNOWN, "no command of the burn loop ran")]
    span = max(t[1] for t in times) - min(t[0] for t in times)
    shown = burn.show_duration(span)
    if span < asked * _LOOP_SHARE:
        return [
            finding(
                exp,
                "burn.duration",
                Verdict.UNKNOWN,
                f"the loop ran {shown} of the {burn.show_duration(asked)} asked for: stopped "
                "short, not judged as a burn",
                measured=round(span, 1),
                expected=asked,
                unit="s",
            )
        ]
    stress = len(_cycles(outputs, "dcgm-diag"))
    return [
        finding(
            exp,
            "burn.duration",
            Verdict.OK,
            f"the loop ran {shown} ({stress} DCGM stress runs)",
            measured=round(span, 1),
            expected=asked,
            unit="s",
        )
    ]


def _dmon(exp: NodeExpectation, outputs: Outputs, out: list[CheckResult]) -> Dmon | None:
    """Every dmon's samples (one dmon per four GPUs), each GPU's count judged against the
    samples asked for; None where no dmon output is usable."""
    rules = burn.rules()
    asked = burn.dmon_samples(exp.burn_s or 0, rules.dmon_interval_s)
    least = asked * rules.min_samples_pct / 100.0
    merged: list[Dmon] = []
    for group, gpus in enumerate(burn.dmon_groups(exp.gpu_count)):
        kind = burn.dmon_kind(group)
        got = outputs.get(kind)
        why = _usable(got)
        if got is None or why is not None:
            out += [
                finding(exp, "burn.samples", Verdict.UNKNOWN, f"{kind}: {why}", subject=f"GPU{g}")
                for g in gpus
            ]
            continue
        dmon = record(got.parse_as(kind), dmon_of)
        merged.append(dmon)
        for gpu in gpus:
            n = len(dmon.of_gpu(gpu))
            verdict = Verdict.OK if n >= least else Verdict.UNKNOWN
            out.append(
                finding(
                    exp,
                    "burn.samples",
                    verdict,
                    f"{n} dmon samples of {asked} asked for"
                    + ("" if verdict is Verdict.OK else ": the sampling does not cover the burn"),
                    subject=f"GPU{gpu}",
                    measured=n,
                    expected=asked,
                )
            )
    return merge_dmon(merged) if merged else None


def _smi(out: ProbeOutput | None) -> SmiRecord | str:
    why = _usable(out)
    if out is None or why is not None:
        return why or "not collected"
    return record(out.parse_as(out.kind), smi_of)


def _tviol(dmon: Dmon | None, gpu: int) -> tuple[int, int] | None:
    """(samples with dmon's thermal violation flag set, samples showing it), None: not shown."""
    if dmon is None or "tviol" not in dmon.columns:
        return None
    shown = [s.values.get("tviol") for s in dmon.of_gpu(gpu)]
    values = [v for v in shown if v is not None]
    return (sum(1 for v in values if v > 0), len(values)) if values else None


def _throttle(
    exp: NodeExpectation,
    before: SmiRecord | str,
    after: SmiRecord | str,
    outputs: Outputs,
    dmon: Dmon | None,
) -> list[CheckResult]:
    out: list[CheckResult] = []
    for gpu in range(exp.gpu_count):
        subject = f"GPU{gpu}"
        why, grown = _grown(before, after, gpu)
        if grown is None:
            flags = _tviol(dmon, gpu)
            if flags is None:
                out.append(finding(exp, "burn.throttle", Verdict.UNKNOWN, why, subject=subject))
            else:
                hot, seen = flags
                out.append(
                    finding(
                        exp,
                        "burn.throttle",
                        Verdict.FAIL if hot else Verdict.OK,
                        f"dmon's thermal violation flag set in {hot} of {seen} samples ({why})",
                        subject=subject,
                        measured=hot,
                        expected=0,
                    )
                )
            continue
        bad = {k: v for k, v in grown.items() if k in _FAILING and v > 0}
        capped = grown.get("sw_power_cap")
        tail = f"; SW power cap {capped / 1e6:.1f} s" if capped else ""
        if bad:
            what = ", ".join(f"{_FAILING[k]} {v / 1e6:.1f} s" for k, v in sorted(bad.items()))
            out.append(
                finding(
                    exp,
                    "burn.throttle",
                    Verdict.FAIL,
                    f"clocks held down during the burn: {what}{tail}",
                    subject=subject,
                    measured=round(sum(bad.values()) / 1e6, 3),
                    expected=0,
                    unit="s",
                )
            )
        else:
            out.append(
                finding(
                    exp,
                    "burn.throttle",
                    Verdict.OK,
                    f"no thermal slowdown or power brake during the burn{tail}",
                    subject=subject,
                    measured=0,
                    expected=0,
                    unit="s",
                )
            )
    return out


def _grown(
    before: SmiRecord | str, after: SmiRecord | str, gpu: int
) -> tuple[str, dict[str, float] | None]:
    """Each clock event counter's growth over the loop (microseconds), or why not known."""
    if isinstance(before, str) or isinstance(after, str):
        which = "before" if isinstance(before, str) else "after"
        return f"nvidia-smi -q {which} the loop: {before if which == 'before' else after}", None
    first = next((g for g in before.gpus if g.index == gpu), None)
    last = next((g for g in after.gpus if g.index == gpu), None)
    if first is None or last is None:
        return (
            f"GPU{gpu} not listed by nvidia-smi {'before' if first is None else 'after'} the loop",
            None,
        )
    a, b = first.clocks_event_counters_us, last.clocks_event_counters_us
    if not a or not b:
        return "the driver prints no clock event counters (R535 and later do)", None
    grown: dict[str, float] = {}
    for key in set(a) | set(b):
        x, y = finite(a.get(key)), finite(b.get(key))
        if x is None or y is None:
            if key in _FAILING:
                return f"the {_FAILING[key]} counter is not a number", None
            continue
        if y < x:
            return f"the {key} counter went back ({x:.0f} -> {y:.0f} us): the GPU was reset", None
        grown[key] = y - x
    return "", grown


def _thermal(exp: NodeExpectation, dmon: Dmon, smi: SmiRecord | str) -> list[CheckResult]:
    out: list[CheckResult] = []
    column = "gtemp" if "gtemp" in dmon.columns else "temp" if "temp" in dmon.columns else None
    if column is None or isinstance(smi, str):
        return out
    for gpu in range(exp.gpu_count):
        record_ = next((g for g in smi.gpus if g.index == gpu), None)
        limit = finite(record_.slowdown_c) if record_ is not None else None
        temps = [finite(s.values.get(column)) for s in dmon.of_gpu(gpu)]
        shown = [t for t in temps if t is not None]
        if limit is None or not shown:
            continue  # T.Limit GPUs report no slowdown temperature: the counters judge them
        hottest = max(shown)
        out.append(
            finding(
                exp,
                "burn.thermal",
                Verdict.FAIL if hottest >= limit else Verdict.OK,
                f"hottest {hottest:.0f} C during the burn, slowdown at {limit:.0f} C",
                subject=f"GPU{gpu}",
                measured=hottest,
                limit=limit,
                unit="C",
            )
        )
    return out


def _dcgm(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    out: list[CheckResult] = []
    runs = _cycles(outputs, "dcgm-diag")
    if not runs:
        return [finding(exp, "burn.dcgm", Verdict.UNKNOWN, "no DCGM stress run in the loop")]
    for cycle, run in runs:
        asked = burn.STRESS_TESTS[(cycle - 1) % len(burn.STRESS_TESTS)]
        where = f"run {cycle} ({asked})"
        why = run.failure()
        result = run.parse_as(run.kind) if why is None else None
        if result is None or not result.recognised:
            known = DCGMI_EXIT.get(run.rc) if run.rc is not None else None
            verdict = Verdict.FAIL if known is not None and known[2] else Verdict.UNKNOWN
            out.append(
                finding(
                    exp,
                    "burn.dcgm",
                    verdict,
                    f"{where}: {why or 'output not recognised'}"
                    + (f" (exit {run.rc}: {known[1]})" if known else ""),
                    subject=f"run{cycle}",
                )
            )
            continue
        diag = diag_of(result.data)
        failed = [
            (canonical(t.name, t.category), gpu)
            for t in diag.tests
            for gpu, word in (t.gpus or (("all", t.result or ""),))
            if word == "Fail"
        ]
        mine = [t for t in diag.tests if canonical(t.name, t.category) == asked]
        if failed:
            notes = [n.text for t in diag.tests for n in t.notes][:3]
            out.append(
                finding(
                    exp,
                    "burn.dcgm",
                    Verdict.FAIL,
                    f"{where}: "
                    + ", ".join(f"{test} failed on GPU{gpu}" for test, gpu in failed)
                    + (f": {notes[0]}" if notes else ""),
                    subject=f"run{cycle}",
                    evidence=tuple(notes),
                )
            )
        elif not mine or any(t.result not in ("Pass", "Warn") for t in mine):
            shown = mine[0].result if mine else "not in the output"
            out.append(
                finding(
                    exp,
                    "burn.dcgm",
                    Verdict.UNKNOWN,
                    f"{where}: {asked} {shown}",
                    subject=f"run{cycle}",
                )
            )
        else:
            out.append(
                finding(exp, "burn.dcgm", Verdict.OK, f"{where}: passed", subject=f"run{cycle}")
            )
    return out


def _busbw(run: ProbeOutput) -> tuple[float | None, str]:
    """The out-of-place busbw of the run's largest message, or None and why."""
    why = run.failure()
    if why is not None:
        return None, why
    result = run.parse_as(run.kind)
    if not result.recognised:
        return None, "output not recognised"
    nccl = nccl_run_of(result.data)
    if nccl.errors:
        return None, f"nccl-tests failed: {nccl.errors[0][:120]}"
    if not nccl.rows:
        return None, "no bandwidth rows"
    largest = max(nccl.rows, key=lambda r: finite(r.size) or 0.0)
    side = largest.out_of_place
    if side is not None and side.wrong not in (0, None):
        return None, f"wrong results (#wrong {side.wrong})"
    value = finite(side.busbw) if side is not None else None
    return value, "" if value is not None else "busbw is not a number"


def loop_busbw(outputs: Outputs) -> list[tuple[int, float]]:
    """(run, busbw) of each all_reduce run of the loop that gave one (the report draws them)."""
    series = []
    for cycle, run in _cycles(outputs, "nccl"):
        busbw, _ = _busbw(run)
        if busbw is not None:
            series.append((cycle, busbw))
    return series


def _nccl(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    runs = _cycles(outputs, "nccl")
    if not runs:
        return [finding(exp, "burn.nccl", Verdict.UNKNOWN, "no all_reduce run in the loop")]
    floor = finite(exp.thresholds.get("nccl_all_reduce_busbw_gbs"))
    out: list[CheckResult] = []
    series: list[tuple[int, float]] = []
    for cycle, run in runs:
        busbw, why = _busbw(run)
        subject = f"run{cycle}"
        if busbw is None:
            wrong = why.startswith(("nccl-tests failed", "wrong results"))
            verdict = Verdict.FAIL if wrong else Verdict.UNKNOWN
            out.append(finding(exp, "burn.nccl", verdict, f"run {cycle}: {why}", subject=subject))
            continue
        series.append((cycle, busbw))
        if floor is not None and busbw < floor:
            out.append(
                finding(
                    exp,
                    "burn.nccl",
                    Verdict.FAIL,
                    f"run {cycle}: busbw {busbw:.1f} GB/s below the floor {floor:.1f}",
                    subject=subject,
                    measured=busbw,
                    expected=floor,
                    unit="GB/s",
                )
            )
    ok_runs = [c for c, _ in series if floor is None or dict(series)[c] >= floor]
    if series and floor is not None and len(ok_runs) == len(series):
        out.append(
            finding(
                exp,
                "burn.nccl",
                Verdict.OK,
                f"{len(series)} all_reduce runs at or above {floor:.1f} GB/s "
                f"(lowest {min(b for _, b in series):.1f})",
                measured=min(b for _, b in series),
                expected=floor,
                unit="GB/s",
            )
        )
    elif series and floor is None:
        out.append(
            finding(exp, "burn.nccl", Verdict.UNKNOWN, "no all_reduce floor for this GPU model")
        )
    out += _drift(exp, series)
    return out


def _drift(exp: NodeExpectation, series: Sequence[tuple[int, float]]) -> list[CheckResult]:
    limit = burn.rules().nccl_drift_max_pct
    if len(series) < 2:
        return [
            finding(
                exp,
                "burn.nccl.drift",
                Verdict.UNKNOWN,
                f"{len(series)} usable all_reduce run(s): drift needs two or more",
            )
        ]
    best, worst_drop, at, best_then = series[0][1], 0.0, series[0][0], series[0][1]
    for cycle, busbw in series[1:]:
        if best > 0:
            drop = 100.0 * (best - busbw) / best
            if drop > worst_drop:
                worst_drop, at, best_then = drop, cycle, best
        best = max(best, busbw)
    verdict = Verdict.FAIL if worst_drop > limit else Verdict.OK
    message = (
        f"run {at} was {worst_drop:.1f} % below the best earlier run ({best_then:.1f} GB/s)"
        if worst_drop > 0
        else f"no run below the best earlier one ({len(series)} runs)"
    )
    return [
        finding(
            exp,
            "burn.nccl.drift",
            verdict,
            message,
            measured=round(worst_drop, 2),
            limit=limit,
            unit="%",
        )
    ]


def _xid(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    before, after = outputs.get("xid"), outputs.get(burn.XID_END)
    for name, got in (("before the tests", before), ("after the loop", after)):
        why = _usable(got)
        if why is not None:
            return [finding(exp, "burn.xid", Verdict.UNKNOWN, f"kernel log {name}: {why}")]
    if before is None or after is None:  # _usable said so already
        return []
    first = record(before.parse_as("xid"), kernel_log_of)
    last = record(after.parse_as("xid"), kernel_log_of)
    known = {(e.timestamp, e.pci, e.xid, e.message) for e in first.events}
    new = [e for e in last.events if (e.timestamp, e.pci, e.xid, e.message) not in known]
    gone = {(f.timestamp, f.pci) for f in first.fallen_off_bus}
    fell = [f for f in last.fallen_off_bus if (f.timestamp, f.pci) not in gone]
    if not new and not fell:
        return [finding(exp, "burn.xid", Verdict.OK, "no Xid during the tests and the burn")]
    shown = [f"Xid {e.xid} on {e.pci}: {(e.message or '')[:80]}" for e in new[:5]]
    shown += [f"GPU {f.pci} fell off the bus" for f in fell[:3]]
    return [
        finding(
            exp,
            "burn.xid",
            Verdict.FAIL,
            f"{len(new)} Xid event(s) during the tests and the burn"
            + (f", {len(fell)} GPU(s) off the bus" if fell else "")
            + f": {shown[0]}",
            measured=len(new) + len(fell),
            expected=0,
            evidence=tuple(shown),
        )
    ]
