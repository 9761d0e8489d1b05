"""NVLink states (``nvidia-smi nvlink -s``) and the growth of NVLink error counters
(``nvidia-smi nvlink -e``, read before and after the GPU tests) on NVLink-connected GPUs."""

from __future__ import annotations

from gpuctl.config.catalog import counter_rules, nvlink_crc_fail_per_second
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, listed_twice, node_judge, usable_parse
from gpuctl.validation.judges.counters import growth, growth_results
from gpuctl.validation.parsers.nvlink_errors import NvlinkErrorsGpu, nvlink_errors_of
from gpuctl.validation.parsers.nvlink_status import nvlink_gpus_of
from gpuctl.validation.plausible import (
    first_seen,
    id_value,
)
from gpuctl.validation.results import CheckResult, Verdict


@node_judge("nvlink")
def judge_nvlink_status(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """Inactive NVLinks (`nvidia-smi nvlink -s`) on NVLink-connected GPUs."""
    result, unknown = usable_parse(exp, outputs, ["nvlink"], "gpu.nvlink")
    if result is None:
        return unknown
    out = list(unknown)
    listed = nvlink_gpus_of(result.data)
    ids = [{"index": gpu.index, "uuid": gpu.uuid} for gpu in listed]  # by the data's keys
    repeats = first_seen(ids, (("index", "index", id_value), ("uuid", "UUID", id_value)))
    out += listed_twice(exp, ids, repeats, where=" in nvidia-smi nvlink -s")
    for gpu in listed:
        links = gpu.links
        down = [str(link) for link in gpu.inactive]
        subject = f"GPU{gpu.index}"
        if down:
            out.append(
                finding(
                    exp,
                    "gpu.nvlink",
                    Verdict.FAIL,
                    f"{len(down)} of {len(links)} NVLinks inactive: {', '.join(down)}",
                    subject=subject,
                    measured=len(links) - len(down),
                    expected=len(links),
                )
            )
    total = sum(len(g.links) for i, g in enumerate(listed) if i not in repeats)
    if total == 0:
        out.append(finding(exp, "gpu.nvlink", Verdict.UNKNOWN, "nvlink -s lists no links"))
    elif not out:
        out.append(finding(exp, "gpu.nvlink", Verdict.OK, f"all {total} NVLinks active"))
    return out


# ------------------------------------------------------------------------------------------
# NVLink error counters (``nvidia-smi nvlink -e``), read before and after the GPU tests

ERRORS = "gpu.nvlink.errors"
START, END = "nvlink-errors.start", "nvlink-errors.end"


@node_judge(START, END)
def judge_nvlink_errors(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """Growth of each NVLink error counter between the two reads (data/counters.yml): replay
    and recovery errors FAIL, others WARN; a counter that cannot be compared is UNKNOWN."""
    first, unknown_start = usable_parse(exp, outputs, [START], ERRORS)
    last, unknown_end = usable_parse(exp, outputs, [END], ERRORS)
    out = unknown_start + unknown_end
    if first is None or last is None:
        return out
    rules = counter_rules("nvlink")
    before = nvlink_errors_of(first.data)
    after = nvlink_errors_of(last.data)
    names = {**before.names, **after.names}

    def key(gpu: NvlinkErrorsGpu) -> tuple[str, object]:
        return ("uuid", gpu.uuid) if gpu.uuid else ("index", gpu.index)

    # CRC errors at DCGM's rate or faster FAIL: the most the reads can be apart bounds the rate
    ran_first, ran_last = outputs[START].ran, outputs[END].ran
    crc: dict[str, tuple[int, str]] = {}
    if ran_first is not None and ran_last is not None and ran_last[1] > ran_first[0]:
        apart = ran_last[1] - ran_first[0]
        per_s = nvlink_crc_fail_per_second()
        most = int(per_s * apart)
        what = f"the most in {apart:.1f} s below DCGM's {per_s:g} per second:"
        crc = {k: (most, what) for g in after.gpus for _, k in g.counts if "crc" in k}
    earlier = {key(g): g for g in before.gpus}
    compared = 0
    for gpu in after.gpus:
        subject = f"GPU{gpu.index}"
        prior = earlier.pop(key(gpu), None)
        if prior is None:
            out.append(
                finding(exp, ERRORS, Verdict.UNKNOWN, "not in the first read", subject=subject)
            )
            continue
        found = growth(
            prior.counts,
            gpu.counts,
            rules,
            lambda k: k[1],
            lambda k: f"link {k[0]} {names.get(k[1], k[1])}",
            crc,
        )
        compared += found.compared
        out += growth_results(exp, ERRORS, subject, found, "the GPU tests")
    for gpu in earlier.values():
        out.append(
            finding(
                exp, ERRORS, Verdict.UNKNOWN, "not in the second read", subject=f"GPU{gpu.index}"
            )
        )
    if compared == 0 and not out:
        out.append(finding(exp, ERRORS, Verdict.UNKNOWN, "nvlink -e shows no error counters"))
    elif not out:
        out.append(
            finding(
                exp,
                ERRORS,
                Verdict.OK,
                f"none of {compared} NVLink error counters grew during the GPU tests",
            )
        )
    return out
