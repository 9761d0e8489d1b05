"""Host <-> GPU copy bandwidth over each GPU's PCIe link (nvbandwidth).

``pcie.h2d`` and ``pcie.d2h``, one result per GPU (subject ``GPU<i>``): nvbandwidth's
host_to_device_memcpy_ce and device_to_host_memcpy_ce, the copy engines between the host and
each GPU, against ``pcie_h2d_gbs`` / ``pcie_d2h_gbs`` (per GPU model, data/gpu_models.yml). A
link trained down (x8: half the bandwidth), a GPU behind a bad switch port or IOMMU translation
in the way fails here even where the link state looks right. A value above what the model's x16
link can carry at all is not a measurement (FAIL, as a lie); a GPU the run did not measure
(N/A, a column missing, fewer GPUs than the node has) or a testcase that did not finish is
UNKNOWN; a testcase nvbandwidth reported as an error, or whose copies did not match their data
pattern, is FAIL.
"""

from __future__ import annotations

from gpuctl.config.catalog import pcie_ceiling
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.nvbandwidth import (
    NVBANDWIDTH,
    NvbandwidthCase,
    NvbandwidthRun,
    nvbandwidth_run_of,
)
from gpuctl.validation.plausible import finite, show_number
from gpuctl.validation.probes import NVBANDWIDTH_D2H, NVBANDWIDTH_H2D
from gpuctl.validation.results import CheckResult, Verdict

# (check, nvbandwidth testcase, threshold key, what it copies)
DIRECTIONS = (
    ("pcie.h2d", NVBANDWIDTH_H2D, "pcie_h2d_gbs", "host -> GPU"),
    ("pcie.d2h", NVBANDWIDTH_D2H, "pcie_d2h_gbs", "GPU -> host"),
)
# a measurement may exceed the nominal link rate by rounding and clock skew, never by more
_CEILING_SLACK = 1.05


@node_judge(NVBANDWIDTH)
def judge_pcie_copies(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    out: list[CheckResult] = []
    for check, testcase, key, what in DIRECTIONS:
        result, unknown = usable_parse(exp, outputs, [NVBANDWIDTH], check)
        if result is None:
            out += unknown
            continue
        out += unknown
        out += _direction(exp, nvbandwidth_run_of(result.data), check, testcase, key, what)
    return out


def _direction(
    exp: NodeExpectation, run: NvbandwidthRun, check: str, testcase: str, key: str, what: str
) -> list[CheckResult]:
    case = run.case(testcase)
    if case is None or case.status != "passed":
        return [_not_measured(exp, run, case, check, testcase)]
    values = case.per_gpu()
    threshold = finite(exp.thresholds.get(key))
    ceiling = pcie_ceiling(exp.pcie_gen, 16) if exp.pcie_gen else None
    source = exp.sources.get(key)
    out: list[CheckResult] = []
    extra = sorted(set(values) - set(range(exp.gpu_count)))
    if extra:
        out.append(
            finding(
                exp,
                check,
                Verdict.UNKNOWN,
                f"{testcase} measured GPU {', '.join(map(str, extra))}, but the node has "
                f"{exp.gpu_count} GPUs (0-{exp.gpu_count - 1})",
            )
        )
    for gpu in range(exp.gpu_count):
        subject = f"GPU{gpu}"
        bus = run.bus_id(gpu)
        at = f" ({bus})" if bus else ""
        raw = values.get(gpu)
        value = finite(raw)
        if value is None:
            shown = "no value" if gpu not in values else f"{show_number(raw)}"
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.UNKNOWN,
                    f"{what}{at}: {testcase} shows {shown} for this GPU: not measured",
                    subject=subject,
                    expected=threshold,
                    unit="GB/s",
                    source=source,
                )
            )
            continue
        if ceiling is not None and value > ceiling.value * _CEILING_SLACK:
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.FAIL,
                    f"{what}{at}: {value:g} GB/s is more than {ceiling.what} carries "
                    f"({ceiling.value:g} GB/s): not a real measurement",
                    subject=subject,
                    measured=value,
                    unit="GB/s",
                    limit=ceiling.value,
                    source=ceiling.source,
                )
            )
            continue
        if threshold is None:
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.UNKNOWN,
                    f"{what}{at}: {value:g} GB/s, but no threshold is set for {exp.gpu_model}: "
                    f"set validation.thresholds.{key}",
                    subject=subject,
                    measured=value,
                    unit="GB/s",
                )
            )
            continue
        ok = value >= threshold
        out.append(
            finding(
                exp,
                check,
                Verdict.OK if ok else Verdict.FAIL,
                f"{what}{at}: {value:g} GB/s " + (">=" if ok else "<") + f" {threshold:g}",
                subject=subject,
                measured=value,
                expected=threshold,
                unit="GB/s",
                limit=ceiling.value if ceiling is not None else None,
                source=source,
            )
        )
    return out


def _not_measured(
    exp: NodeExpectation,
    run: NvbandwidthRun,
    case: NvbandwidthCase | None,
    check: str,
    testcase: str,
) -> CheckResult:
    errors = tuple(run.errors[:5])
    if case is not None and case.status == "error":
        return finding(
            exp,
            check,
            Verdict.FAIL,
            f"nvbandwidth {testcase} failed: {case.message or 'error'}",
            evidence=errors,
        )
    if case is not None and any(e.startswith("Invalid value when checking") for e in errors):
        return finding(
            exp,
            check,
            Verdict.FAIL,
            f"nvbandwidth {testcase}: the copied data did not match its pattern (corrupted)",
            evidence=errors,
        )
    if case is None:
        why = "not in the output"
        if run.waived:
            why += f" ({run.waived} testcase(s) waived)"
    else:
        why = f"did not finish ({case.status}" + (f": {case.message})" if case.message else ")")
    return finding(
        exp,
        check,
        Verdict.UNKNOWN,
        f"nvbandwidth {testcase} {why}: no copy bandwidth measured",
        evidence=errors,
    )
