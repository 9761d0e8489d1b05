"""DCGM diagnostics (``dcgmi diag -r 2`` / ``-r 3``)."""

from __future__ import annotations

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.dcgm import diag_of
from gpuctl.validation.results import CheckResult, Verdict


@node_judge("dcgm-diag")
def judge_dcgm(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = usable_parse(exp, outputs, ["dcgm-diag"], "dcgm")
    if result is None:
        return unknown
    diag = diag_of(result.data)
    out = list(unknown)
    for test in diag.tests:
        res = str(test.result or "")
        verdict = {
            "pass": Verdict.OK,
            "fail": Verdict.FAIL,
            "warn": Verdict.WARN,
            "skip": Verdict.OK,
        }.get(res.lower(), Verdict.UNKNOWN)
        if verdict is Verdict.OK and res.lower() == "skip":
            continue
        messages = test.messages
        out.append(
            finding(
                exp,
                "dcgm.diag",
                verdict,
                f"{test.name}: {res or 'no result'}",
                subject=str(test.name),
                evidence=messages[:3],
            )
        )
    if diag.overall is None:
        out.append(finding(exp, "dcgm.diag", Verdict.UNKNOWN, "dcgmi diag output is incomplete"))
    return out
