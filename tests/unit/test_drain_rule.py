"""Drain reasons that name their checks (with units), and the one resume rule of
`validate --drain-failed` and node-check (gpuctl/slurm.py; docs/validate.md, "Slurm").

Before: `validate --level standard --drain-failed` drained a node for low NCCL bandwidth and
the next `validate --level quick --drain-failed` resumed it although NCCL was never re-run; the
reason carried one check and thresholds without units ("152 Gb/s < 360").
"""

from __future__ import annotations

from typing import Any

from gpuctl.slurm import (
    REASON_MAX_BYTES,
    drain_reason_for,
    read_reason,
    reason_checks,
    resume_rule,
)
from gpuctl.validation import nodecheck
from gpuctl.validation import slurm as validate_slurm
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict

NODE = "gpu002"


def _busbw(value: float, verdict: Verdict = Verdict.FAIL) -> CheckResult:
    return CheckResult(
        "nccl.busbw",
        NODE,
        verdict,
        f"busbw {value:g} GB/s at 8589934592 B < 360",
        measured=value,
        expected=360.0,
        unit="GB/s",
    )


def _ok(check: str, subject: str | None = None) -> CheckResult:
    return CheckResult(check, NODE, Verdict.OK, "fine", subject=subject)


def _record(state: str, reason: str | None) -> dict[str, Any]:
    base, *flags = state.split("+")
    return {"NodeName": NODE, "state": base, "state_flags": flags, "reason": reason}


def _plan(level: str, checks: list[CheckResult], reason: str | None) -> list[Any]:
    report = ValidationReport("lab", level, (NodeReport(NODE, tuple(checks)),))
    return validate_slurm.plan(report, {NODE: _record("IDLE+DRAIN", reason)})


# ------------------------------------------------------------------------------------------
# The reason


def test_the_reason_names_every_failed_check_with_units_and_the_level() -> None:
    ib = CheckResult(
        "ib.write_bw", NODE, Verdict.FAIL, "152 Gb/s < 360", subject="mlx5_0",
        measured=152.0, expected=360.0, unit="Gb/s",
    )  # fmt: skip
    ib2 = CheckResult(
        "ib.write_bw", NODE, Verdict.FAIL, "150 Gb/s < 360", subject="mlx5_1",
        measured=150.0, expected=360.0, unit="Gb/s",
    )  # fmt: skip
    xid = CheckResult("xid", NODE, Verdict.FAIL, "Xid 79 on GPU3; fell off the bus")
    node = NodeReport(NODE, (_busbw(120), _ok("gpu.count"), ib, ib2, xid))
    reason = drain_reason_for(node, "gpuctl:", "standard")
    assert reason == (
        "gpuctl: nccl.busbw 120 GB/s < 360 GB/s; ib.write_bw mlx5_0 152 Gb/s < 360 Gb/s, "
        "1 more; xid Xid 79 on GPU3, fell off the bus [standard]"
    )
    assert reason_checks(reason, "gpuctl:") == ("nccl.busbw", "ib.write_bw", "xid")


def test_a_long_reason_keeps_every_check_id_within_slurms_limit() -> None:
    long = "x" * 400
    checks = tuple(
        CheckResult(f"gpu.check{i}", NODE, Verdict.FAIL, long, subject=f"GPU{i}") for i in range(8)
    )
    reason = drain_reason_for(NodeReport(NODE, checks), "gpuctl:", "quick")
    assert reason is not None
    assert len(reason.encode()) <= REASON_MAX_BYTES
    assert reason_checks(reason, "gpuctl:") == tuple(f"gpu.check{i}" for i in range(8))
    read = read_reason(reason, "gpuctl:")
    assert read is not None
    assert read.level == "quick"
    # more checks than even their families fit: the reason says so and names none (fail
    # closed)
    many = tuple(CheckResult(f"fam{i:02}.check", NODE, Verdict.FAIL, "m") for i in range(30))
    crowded = drain_reason_for(NodeReport(NODE, many), "gpuctl:", "quick")
    assert crowded is not None
    assert len(crowded.encode()) <= REASON_MAX_BYTES
    assert " more checks [quick]" in crowded
    assert reason_checks(crowded, "gpuctl:") is None


# A node whose nccl-tests corrupt data fails busbw, errors and wrong of all five collectives:
# 15 check ids, more than Slurm's 255 bytes hold with the others
NCCL_CHECKS = tuple(
    f"nccl.{c}{check}"
    for c in ("", "all_gather.", "reduce_scatter.", "alltoall.", "sendrecv.")
    for check in ("busbw", "errors", "wrong")
)


def _nccl_failures() -> list[CheckResult]:
    return [CheckResult(c, NODE, Verdict.FAIL, "x" * 40) for c in NCCL_CHECKS]


def test_checks_whose_ids_do_not_fit_are_named_by_their_family() -> None:
    flaps = CheckResult("ib.port.errors", NODE, Verdict.FAIL, "port 1 LinkDownedCounter +2")
    reason = drain_reason_for(NodeReport(NODE, (*_nccl_failures(), flaps)), "gpuctl:", "standard")
    assert reason == "gpuctl: nccl.*; ib.port.errors [standard]"
    assert reason_checks(reason, "gpuctl:") == ("nccl.*", "ib.port.errors")


def test_a_family_resumes_only_at_the_level_of_the_drain_with_every_member_passing() -> None:
    reason = "gpuctl: nccl.*; ib.port.errors [standard]"
    passing = [_ok(c) for c in (*NCCL_CHECKS, "gpu.count")]
    # quick runs no nccl-tests: that proves nothing of the family
    [quick] = _plan("quick", [_ok("gpu.count"), _ok("ib.port.errors")], reason)
    assert quick.detail == "kept drained: nccl.* not run at level quick"
    [resumed] = _plan("standard", passing, reason)
    assert (resumed.action, resumed.detail) == (
        "resume",
        "resume: nccl.*, ib.port.errors passed again",
    )
    # one member still failing keeps it drained (and its failure is one the reason holds)
    slow = CheckResult("nccl.alltoall.busbw", NODE, Verdict.FAIL, "busbw 180 < 324")
    [kept] = _plan("standard", [*passing[1:], slow], reason)
    assert (kept.action, kept.detail) == ("none", "already drained by gpuctl")
    # one member unknown: kept drained
    unknown = CheckResult("nccl.sendrecv.busbw", NODE, Verdict.UNKNOWN, "timed out")
    report = ValidationReport(
        "lab", "standard", (NodeReport(NODE, (*passing, unknown), unknown_fails=False),)
    )
    [action] = validate_slurm.plan(report, {NODE: _record("IDLE+DRAIN", reason)})
    assert (action.action, action.detail) == ("none", "kept drained: nccl.* unknown")


def test_the_reason_reaches_scontrol_whole() -> None:
    node = NodeReport(NODE, (_busbw(120), CheckResult("xid", NODE, Verdict.FAIL, "y" * 90)))
    reason = drain_reason_for(node, "gpuctl:", "standard")
    assert reason is not None
    assert len(reason) > 100  # the old cut was 100 characters: it lost the level and checks
    action = validate_slurm.SlurmAction(NODE, "drain", reason, "")
    assert validate_slurm.update_argv(action)[-1] == f"reason={reason}"


# ------------------------------------------------------------------------------------------
# validate --drain-failed


def test_a_quick_run_keeps_a_node_drained_for_nccl() -> None:
    reason = "gpuctl: nccl.busbw 120 GB/s < 360 GB/s [standard]"
    [action] = _plan("quick", [_ok("node.reachable"), _ok("gpu.count")], reason)
    assert (action.action, action.detail) == (
        "none",
        "kept drained: nccl.busbw not run at level quick",
    )
    [action] = _plan("standard", [_ok("gpu.count"), _busbw(400, Verdict.OK)], reason)
    assert (action.action, action.detail) == ("resume", "resume: nccl.busbw passed again")


def test_a_named_check_that_is_unknown_keeps_the_node_drained() -> None:
    reason = "gpuctl: nccl.busbw 120 GB/s < 360 GB/s [standard]"
    unknown = CheckResult("nccl.busbw", NODE, Verdict.UNKNOWN, "timed out")
    report = ValidationReport(
        "lab", "standard", (NodeReport(NODE, (_ok("gpu.count"), unknown), unknown_fails=False),)
    )
    [action] = validate_slurm.plan(report, {NODE: _record("IDLE+DRAIN", reason)})
    assert (action.action, action.detail) == ("none", "kept drained: nccl.busbw unknown")


def test_a_check_that_reports_only_failures_passes_at_the_level_of_the_drain() -> None:
    # gpu.pcie.width says nothing when the link is fine: a run at the drain's level ran it
    reason = "gpuctl: gpu.pcie.width GPU2 PCIe link trained at x8 of x16 [quick]"
    [action] = _plan("quick", [_ok("gpu.count")], reason)
    assert action.action == "resume"
    [action] = _plan("quick", [_ok("gpu.count")], reason.replace("[quick]", "[standard]"))
    assert action.detail == "kept drained: gpu.pcie.width not run at level quick"


def test_dcgm_counts_only_at_the_level_of_the_drain() -> None:
    reason = "gpuctl: dcgm.diag targeted_stress Fail [long]"
    [action] = _plan("standard", [_ok("dcgm.diag", "memory")], reason)
    assert action.detail == "kept drained: dcgm.diag not run at level standard"
    [action] = _plan("long", [_ok("dcgm.diag", "targeted_stress")], reason)
    assert action.action == "resume"


def test_old_reasons_resume_only_at_the_most_thorough_level() -> None:
    # written before reasons carried their level: as if drained at long (fail closed)
    old = "gpuctl: gpu.pcie.width GPU2 PCIe link trained at x8 of x16"
    assert _plan("standard", [_ok("gpu.count")], old)[0].action == "none"
    assert _plan("long", [_ok("gpu.count")], old)[0].action == "resume"
    # one that did not name every check ("(+2 more)") names none gpuctl can read
    cut = "gpuctl: gpu.count 7 GPUs visible (+2 more)"
    [action] = _plan("standard", [_ok("gpu.count")], cut)
    assert action.action == "none"
    assert action.detail.startswith("kept drained: its reason names no checks gpuctl can read")
    assert _plan("long", [_ok("gpu.count")], cut)[0].action == "resume"


def test_a_drained_node_failing_again_keeps_the_checks_it_was_drained_for() -> None:
    reason = "gpuctl: nccl.busbw 120 GB/s < 360 GB/s [standard]"
    count = CheckResult(
        "gpu.count", NODE, Verdict.FAIL, "7 GPUs visible, expected 8", measured=7, expected=8
    )
    [action] = _plan("quick", [count], reason)
    assert action.action == "drain"
    assert action.reason == (
        "gpuctl: gpu.count 7 GPUs visible, expected 8; nccl.busbw 120 GB/s < 360 GB/s [standard]"
    )
    # the next quick run passes gpu.count: still drained for nccl.busbw
    [after] = _plan("quick", [_ok("gpu.count")], action.reason)
    assert after.detail == "kept drained: nccl.busbw not run at level quick"
    # the same failure again adds no check: the reason (and Slurm's time for it) stays
    [same] = _plan("quick", [count], action.reason)
    assert (same.action, same.detail) == ("none", "already drained by gpuctl")


# ------------------------------------------------------------------------------------------
# node-check and the rule itself


def test_node_check_follows_the_same_rule() -> None:
    reason = "gpuctl node-check: nccl.busbw 120 GB/s < 360 GB/s [standard]"
    record = _record("IDLE+DRAIN", reason)
    passing = NodeReport(NODE, (_ok("gpu.count"),))
    quick = nodecheck.slurm_plan(passing, record, "quick")
    assert (quick.action, quick.detail) == (
        "none",
        "kept drained: nccl.busbw not run at level quick",
    )
    standard = NodeReport(NODE, (_ok("gpu.count"), _busbw(400, Verdict.OK)))
    assert nodecheck.slurm_plan(standard, record, "standard").action == "resume"


def test_the_rule_never_resumes_a_failing_node() -> None:
    failing = NodeReport(NODE, (_busbw(120),))
    rule = resume_rule("gpuctl: xid 79 [quick]", "gpuctl:", failing, "quick", "long")
    assert not rule.resume
