"""NVLink states (``nvidia-smi nvlink -s``) on NVLink-connected GPUs."""

from __future__ import annotations

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, listed_twice, node_judge, usable_parse
from gpuctl.validation.parsers.nvsmi_tables import nvlink_gpus_of
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
