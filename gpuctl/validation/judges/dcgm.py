"""DCGM diagnostics (``dcgmi diag -r 2`` / ``-r 3``)."""

from __future__ import annotations

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.results import CheckResult, Verdict


@node_judge("dcgm-diag")
def judge_dcgm(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = usable_parse(exp, outputs, ["dcgm-diag"], "dcgm")
    if result is None:
        return unknown
    out = list(unknown)
    for test in result.data.get("tests") or []:
        res = str(test.get("result") or "")
        verdict = {
            "pass": Verdict.OK,
            "fail": Verdict.FAIL,
            "warn": Verdict.WARN,
            "skip": Verdict.OK,
        }.get(res.lower(), Verdict.UNKNOWN)
        if verdict is Verdict.OK and res.lower() == "skip":
            continue
        messages = tuple(str(m) for m in test.get("messages") or [])
        out.append(
            finding(
                exp,
                "dcgm.diag",
                verdict,
                f"{test.get('name')}: {res or 'no result'}",
                subject=str(test.get("name")),
                evidence=messages[:3],
            )
        )
    overall = result.data.get("overall")
    if overall is None:
        out.append(finding(exp, "dcgm.diag", Verdict.UNKNOWN, "dcgmi diag output is incomplete"))
    return out
