"""GPU <-> GPU copy bandwidth over NVSwitch (nvbandwidth's device_to_device testcases).

``p2p.read`` and ``p2p.write``, one result per GPU (subject ``GPU<i>``): the copy engines of
each GPU reading from (``device_to_device_memcpy_read_ce``) or writing to
(``device_to_device_memcpy_write_ce``) every peer, against ``p2p_read_gbs`` / ``p2p_write_gbs``
(per GPU model, data/gpu_models.yml). On an NVSwitch system every pair has the same NVLink
path, so one slow NVLink or NVSwitch port shows as the pairs through it, which a ring
all_reduce hides. Each GPU's result is its slowest pair, and a failure names every pair of its
row below the floor. A value above one direction of the model's NVLink is not a measurement
(FAIL); N/A for a pair, a GPU missing from the matrix or a testcase that did not finish is
UNKNOWN; a testcase nvbandwidth reported as an error or waived (peer access not possible, where
NVSwitch promises it) is FAIL.
"""

from __future__ import annotations

from gpuctl.config.catalog import ceiling_tolerance, nvlink_ceiling
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, record, usable_parse
from gpuctl.validation.parsers.nvbandwidth import NvbandwidthRun, nvbandwidth_run_of
from gpuctl.validation.plausible import finite, show_number
from gpuctl.validation.probes import NVBANDWIDTH_D2D_READ, NVBANDWIDTH_D2D_WRITE
from gpuctl.validation.results import CheckResult, Verdict

KIND = "nvbandwidth.d2d"
# (check, testcase, threshold key, the arrow between the row GPU and its peer)
DIRECTIONS = (
    ("p2p.read", NVBANDWIDTH_D2D_READ, "p2p_read_gbs", "reads from"),
    ("p2p.write", NVBANDWIDTH_D2D_WRITE, "p2p_write_gbs", "writes to"),
)


@node_judge(KIND)
def judge_p2p_copies(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    out: list[CheckResult] = []
    for check, testcase, key, verb in DIRECTIONS:
        result, unknown = usable_parse(exp, outputs, [KIND], check)
        out += unknown
        if result is not None:
            out += _direction(exp, record(result, nvbandwidth_run_of), check, testcase, key, verb)
    return out


def _direction(
    exp: NodeExpectation, run: NvbandwidthRun, check: str, testcase: str, key: str, verb: str
) -> list[CheckResult]:
    case = run.case(testcase)
    if case is None or case.status != "passed":
        status = "not in the output" if case is None else case.status
        message = f": {case.message}" if case is not None and case.message else ""
        # v0.8 on do not name what they waive: an unnamed waiver may be this testcase
        unnamed = run.waived - sum(1 for c in run.testcases if c.status == "waived")
        if case is None and unnamed > 0:
            status += f" ({unnamed} testcase(s) waived: peer access not possible?)"
        refused = case.status in ("error", "waived") if case is not None else unnamed > 0
        verdict = Verdict.FAIL if refused else Verdict.UNKNOWN
        return [
            finding(
                exp,
                check,
                verdict,
                f"nvbandwidth {testcase} {status}{message}: no GPU-to-GPU copy bandwidth",
                evidence=tuple(run.errors[:5]),
            )
        ]
    pairs = case.per_pair()
    threshold = finite(exp.thresholds.get(key))
    source = exp.sources.get(key)
    ceiling = nvlink_ceiling(exp.gpu_model)
    most = ceiling.value * (1.0 + ceiling_tolerance()) if ceiling is not None else None
    out: list[CheckResult] = []
    for gpu in range(exp.gpu_count):
        peers = [p for p in range(exp.gpu_count) if p != gpu]
        values = {p: pairs.get((gpu, p)) for p in peers}
        measured = {p: f for p, v in values.items() if (f := finite(v)) is not None}
        high = max(measured.values(), default=0.0)
        if most is not None and ceiling is not None and high > most:
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.FAIL,
                    f"GPU{gpu} {verb} a peer at {high:g} GB/s, more than {ceiling.what} carries "
                    f"({ceiling.value:g} GB/s): not a real measurement",
                    subject=f"GPU{gpu}",
                    measured=high,
                    unit="GB/s",
                    limit=ceiling.value,
                    source=ceiling.source,
                )
            )
            continue
        missing = [p for p in peers if p not in measured]
        if missing:
            shown = ", ".join(
                f"GPU{p}: {'not shown' if (gpu, p) not in pairs else show_number(values[p])}"
                for p in missing[:4]
            )
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.UNKNOWN,
                    f"GPU{gpu} {verb} {len(missing)} peer(s) unmeasured ({shown})",
                    subject=f"GPU{gpu}",
                    expected=threshold,
                    unit="GB/s",
                    source=source,
                )
            )
            continue
        worst = min(measured, key=measured.__getitem__)
        low = measured[worst]
        if threshold is None:
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.UNKNOWN,
                    f"GPU{gpu} {verb} its peers at {low:g}-{high:g} GB/s, but no threshold is set "
                    f"for {exp.gpu_model}: set validation.thresholds.{key}",
                    subject=f"GPU{gpu}",
                    measured=low,
                    unit="GB/s",
                )
            )
            continue
        slow = sorted((p for p, v in measured.items() if v < threshold), key=measured.__getitem__)
        if slow:
            named = ", ".join(f"GPU{p} {measured[p]:g}" for p in slow[:7])
            message = f"GPU{gpu} {verb} {named} GB/s < {threshold:g}"
            if len(slow) < len(measured):
                message += f" (its other peers {high:g})"
        else:
            message = f"GPU{gpu} {verb} every peer at {low:g} GB/s or more >= {threshold:g}"
        out.append(
            finding(
                exp,
                check,
                Verdict.FAIL if slow else Verdict.OK,
                message,
                subject=f"GPU{gpu}",
                measured=low,
                expected=threshold,
                unit="GB/s",
                limit=ceiling.value if ceiling is not None else None,
                source=source,
            )
        )
    return out
