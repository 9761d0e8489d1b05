"""The rollout executor against the fake cluster: the pipeline, failures, halts, abort, resume."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rollout_fake import (
    FOREIGN_REASON,
    OLD,
    TARGET,
    VALIDATION_FAILURE,
    FakeBackend,
    KillableStore,
    Script,
    continue_rollout,
    event_sequence,
    make_fake,
    outcome,
    plan_for,
    replay_audit,
    run_with_kills,
    start,
)

from gpuctl.rollout.executor import Executor
from gpuctl.rollout.model import (
    Action,
    Component,
    NodePlan,
    Phase,
    Plan,
    Policy,
    PolicyError,
    RolloutState,
    Status,
    drain_reason,
)
from gpuctl.rollout.run import read_nodes
from gpuctl.rollout.store import RolloutStore

REASON = drain_reason(Component.DRIVER, TARGET)
POLICY = Policy(
    max_unavailable=1,
    failure_threshold=1,
    drain_timeout_s=100,
    reboot_timeout_s=1800,
    poll_interval_s=1,
    validate_level="quick",
)
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def names(n: int) -> list[str]:
    return [f"gpu{i:03d}" for i in range(1, n + 1)]


def run(
    tmp_path: Path,
    fake: FakeBackend,
    policy: Policy = POLICY,
    component: Component = Component.DRIVER,
) -> tuple[RolloutState, list[dict[str, Any]], KillableStore]:
    plan = plan_for(fake, policy, component=component)
    store = start(fake, tmp_path / "rollout", plan)
    state = Executor(fake, store).run()
    audit = store.read_audit()
    untouchable = [n for n, s in state.nodes.items() if s.phase is Phase.LEFT]
    replay = replay_audit(audit, plan.max_unavailable, untouchable)
    assert replay.violations == []
    assert replay.held == set(state.held)
    assert fake.max_gpuctl_drained <= plan.max_unavailable
    return state, audit, store


def slurm(fake: FakeBackend, node: str) -> tuple[list[str], str | None]:
    return sorted(fake.settled_flags(node)), fake.nodes[node].reason


def planned(plan: Plan) -> dict[str, NodePlan]:
    return {p.node: p for p in plan.nodes}


def node_view(state: RolloutState, node: str) -> tuple[str, str, bool]:
    s = state.nodes[node]
    return str(s.phase), s.reason, s.drained


# --- the pipeline ---------------------------------------------------------------------------


def test_happy_path_drains_waits_applies_restarts_validates_resumes(tmp_path: Path) -> None:
    fake = make_fake(["gpu001"], scripts={"gpu001": Script(jobs_polls=3)})
    state, audit, store = run(tmp_path, fake)

    assert state.status is Status.DONE
    assert node_view(state, "gpu001") == ("done", "", False)
    assert slurm(fake, "gpu001") == (["IDLE"], None)
    assert fake.nodes["gpu001"].running[Component.DRIVER] == TARGET
    assert fake.calls_of("drain") == ["gpu001"]
    assert [m for m, _ in fake.calls] == [
        "slurm_node",
        "versions",
        "slurm_node",
        "drain",
        "jobs_on",
        "jobs_on",
        "jobs_on",
        "jobs_on",
        "versions",
        "apply",
        "restart",
        "wait_up",
        "versions",
        "validate",
        "slurm_node",
        "resume",
        # Slurm shows a node it just resumed NOT_RESPONDING until it registers again: the
        # slot is given back once it has
        "slurm_node",
        "slurm_node",
    ]
    assert event_sequence(audit, "gpu001") == [
        "draining",
        "drained",
        "waiting-jobs",
        "jobs-done",
        "applying",
        "applied",
        "restarting",
        "restart-issued",
        "waiting-up",
        "up",
        "verifying",
        "verified",
        "validating",
        "validated",
        "resuming",
        "resumed",
        "done",
    ]
    assert event_sequence(audit, None) == ["planned", "started", "finished"]
    by_event = {line["event"]: line for line in audit if line["node"] == "gpu001"}
    assert by_event["draining"]["reason"] == "gpuctl rollout: driver 2.0"
    assert by_event["jobs-done"]["polls"] == 4
    assert by_event["jobs-done"]["waited_s"] == 3.0
    assert by_event["restart-issued"]["kind"] == "reboot"
    assert by_event["validated"]["level"] == "quick"
    assert all(TS.match(line["ts"]) and line["rollout"] == "rollout" for line in audit)
    on_disk = json.loads(store.state_path.read_text(encoding="utf-8"))
    assert on_disk == state.to_json()
    assert on_disk["status"] == "done"
    assert on_disk["failed"] == []


def test_write_ahead_every_phase_is_on_disk_before_its_side_effect(tmp_path: Path) -> None:
    fake = make_fake(["gpu001"])
    seen: list[tuple[str, str]] = []
    plan = plan_for(fake, POLICY)
    store = start(fake, tmp_path / "r", plan)

    def look(_fake: FakeBackend, method: str, node: str) -> None:
        on_disk = json.loads(store.state_path.read_text(encoding="utf-8"))
        seen.append((method, on_disk["nodes"][node]["phase"]))

    fake.hook = look
    Executor(fake, store).run()
    effects = [(m, p) for m, p in seen if m in ("drain", "apply", "restart", "wait_up", "validate")]
    assert effects == [
        ("drain", "draining"),
        ("apply", "applying"),
        ("restart", "restarting"),
        ("wait_up", "waiting-up"),
        ("validate", "validating"),
    ]
    assert ("resume", "resuming") in seen
    # after the resume: only reads (Slurm's view) until the node is back in service
    after = seen[seen.index(("resume", "resuming")) + 1 :]
    assert after
    assert all(m == "slurm_node" for m, _ in after)


def test_power_cycle_for_gpu_firmware_and_no_restart_for_the_bmc(tmp_path: Path) -> None:
    fake = make_fake(["gpu001"], component=Component.GPU_FIRMWARE)
    state, audit, _ = run(tmp_path / "gpu", fake, component=Component.GPU_FIRMWARE)
    assert state.status is Status.DONE
    assert [line["kind"] for line in audit if line["event"] == "restart-issued"] == ["power-cycle"]
    assert fake.nodes["gpu001"].running[Component.GPU_FIRMWARE] == TARGET
    assert fake.nodes["gpu001"].reason is None

    bmc = make_fake(["gpu001"], component=Component.BMC_FIRMWARE)
    state, audit, _ = run(tmp_path / "bmc", bmc, component=Component.BMC_FIRMWARE)
    assert state.status is Status.DONE
    assert bmc.calls_of("restart") == []
    assert bmc.calls_of("wait_up") == []
    assert "restarting" not in event_sequence(audit, "gpu001")
    assert bmc.nodes["gpu001"].running[Component.BMC_FIRMWARE] == TARGET


def test_drain_timeout_resumes_the_node_and_fails_it(tmp_path: Path) -> None:
    fake = make_fake(names(2), scripts={"gpu001": Script(drain_timeout=True)})
    policy = Policy(max_unavailable=1, failure_threshold=2, drain_timeout_s=10, poll_interval_s=1)
    state, audit, _ = run(tmp_path, fake, policy)

    assert node_view(state, "gpu001") == ("failed", "jobs still running after 10 s", False)
    assert state.nodes["gpu001"].failed_phase is Phase.WAITING_JOBS
    assert slurm(fake, "gpu001") == (["MIXED"], None)  # back in service, jobs running
    assert fake.calls_of("apply") == ["gpu002"]
    assert len(fake.calls_of("jobs_on")) == 11 + 1  # 0..10 s for gpu001, once for gpu002
    assert event_sequence(audit, "gpu001")[-3:] == ["waiting-jobs", "resumed", "failed"]
    # below the threshold: the rollout goes on and ends done, with the failure listed
    assert state.status is Status.DONE
    assert state.failed == ["gpu001"]
    assert state.nodes["gpu002"].phase is Phase.DONE


def test_apply_error_leaves_the_node_drained_and_failed(tmp_path: Path) -> None:
    fake = make_fake(names(2), scripts={"gpu001": Script(apply_error=True)})
    state, audit, _ = run(tmp_path, fake)

    assert node_view(state, "gpu001") == (
        "failed",
        "gpu001: flashing driver 2.0: exit status 1",
        True,
    )
    assert state.nodes["gpu001"].failed_phase is Phase.APPLYING
    assert slurm(fake, "gpu001") == (["DRAIN", "IDLE"], REASON)
    assert fake.calls_of("resume") == []
    assert state.held == ["gpu001"]
    # threshold 1: halted, gpu002 never touched
    assert state.status is Status.HALTED
    assert state.reason == "1 node(s) failed, failure_threshold is 1: gpu001"
    assert node_view(state, "gpu002") == ("pending", "", False)
    assert "gpu002" not in fake.calls_of("drain")
    assert event_sequence(audit, None)[-1] == "halted"


def test_a_node_that_does_not_come_back_halts_whatever_the_threshold(tmp_path: Path) -> None:
    fake = make_fake(names(4), scripts={"gpu001": Script(no_come_back=True)})
    policy = Policy(max_unavailable=2, failure_threshold=4, poll_interval_s=1)
    state, _, _ = run(tmp_path, fake, policy)

    reason = "gpu001 did not come back within 1800 s after reboot"
    assert node_view(state, "gpu001") == ("failed", reason, True)
    assert state.nodes["gpu001"].halts
    assert state.nodes["gpu002"].phase is Phase.DONE  # in flight with it: finished
    assert state.status is Status.HALTED
    assert state.reason == reason
    assert [state.nodes[n].phase for n in ("gpu003", "gpu004")] == [Phase.PENDING] * 2
    assert sorted(fake.calls_of("drain")) == ["gpu001", "gpu002"]


def test_continuing_a_halted_rollout_acknowledges_a_node_that_did_not_come_back(
    tmp_path: Path,
) -> None:
    fake = make_fake(names(3), scripts={"gpu001": Script(no_come_back=True)})
    policy = Policy(max_unavailable=1, failure_threshold=2, poll_interval_s=1)
    state, _, store = run(tmp_path, fake, policy)
    assert state.status is Status.HALTED
    assert state.reason == "gpu001 did not come back within 1800 s after reboot"

    # the operator continues: the failure no longer halts by itself, but counts and keeps the
    # node's slot (it is still drained with gpuctl's reason), so the budget stops the rollout
    state = continue_rollout(fake, store.directory)
    assert state.status is Status.HALTED
    assert state.reason == "max_unavailable (1) is used up by failed nodes left drained: gpu001"
    assert not state.nodes["gpu001"].halts
    assert state.nodes["gpu001"].failed_phase is Phase.WAITING_UP
    [ack] = [x for x in store.read_audit() if x["event"] == "halt-acknowledged"]
    assert ack["nodes"] == ["gpu001"]

    # repaired and resumed in Slurm by the operator: gpuctl lets go of it and goes on
    n = fake.nodes["gpu001"]
    n.down, n.script.no_come_back, n.drained, n.reason = False, False, False, None
    state = continue_rollout(fake, store.directory)
    assert state.status is Status.DONE
    assert state.failed == ["gpu001"]
    assert [state.nodes[x].phase for x in ("gpu002", "gpu003")] == [Phase.DONE] * 2
    assert replay_audit(store.read_audit(), 1, []).violations == []


def test_validation_failure_keeps_the_node_drained_with_gpuctls_reason(tmp_path: Path) -> None:
    fake = make_fake(names(3), scripts={"gpu002": Script(validation_fail=True)})
    policy = Policy(max_unavailable=1, failure_threshold=2, poll_interval_s=1)
    state, audit, _ = run(tmp_path, fake, policy)

    assert node_view(state, "gpu002") == (
        "failed",
        f"validation (standard) failed: {VALIDATION_FAILURE}",
        True,
    )
    assert state.nodes["gpu002"].failed_phase is Phase.VALIDATING
    assert slurm(fake, "gpu002") == (["DRAIN", "IDLE"], REASON)
    assert "gpu002" not in fake.calls_of("resume")
    failed = [line for line in audit if line["event"] == "failed"]
    assert failed == [
        {
            **failed[0],
            "node": "gpu002",
            "phase": "validating",
            "reason": f"validation (standard) failed: {VALIDATION_FAILURE}",
            "drained": True,
            "halts": False,
        }
    ]
    # it counts (1 of 2) and holds the only slot: gpu003 cannot start
    assert state.status is Status.HALTED
    assert state.reason == "max_unavailable (1) is used up by failed nodes left drained: gpu002"
    assert state.nodes["gpu003"].phase is Phase.PENDING


def test_wrong_version_after_restart_fails(tmp_path: Path) -> None:
    fake = make_fake(["gpu001"], scripts={"gpu001": Script(wrong_version=True)})
    state, _, _ = run(tmp_path, fake)
    assert node_view(state, "gpu001") == (
        "failed",
        f"running {OLD} after reboot, expected {TARGET}",
        True,
    )
    assert fake.calls_of("validate") == []


def test_resume_waits_until_slurmd_has_registered_after_the_reboot(tmp_path: Path) -> None:
    # Slurm shows the rebooted node NOT_RESPONDING (idle*) for 4 more polls: resuming it then
    # would put a node Slurm cannot reach back in service and free its slot too early
    fake = make_fake(names(2), scripts={"gpu001": Script(slurmd_late=4)})
    state, audit, _ = run(tmp_path, fake, Policy(max_unavailable=1, poll_interval_s=1))

    assert state.status is Status.DONE
    assert fake.nodes["gpu001"].resumed_unregistered == 0
    assert slurm(fake, "gpu001") == (["IDLE"], None)
    events = [(line["event"], line.get("node")) for line in audit]
    resumed = events.index(("resumed", "gpu001"))
    # gpu002 starts only after gpu001 is back in service
    assert resumed < events.index(("draining", "gpu002"))
    assert replay_audit(audit, 1, []).peak == 1


def test_slurmd_that_never_registers_fails_the_node_left_drained(tmp_path: Path) -> None:
    fake = make_fake(names(2), scripts={"gpu001": Script(slurmd_never=True)})
    policy = Policy(max_unavailable=1, failure_threshold=2, reboot_timeout_s=60, poll_interval_s=5)
    state, audit, _ = run(tmp_path, fake, policy)

    assert node_view(state, "gpu001") == (
        "failed",
        "slurmd on gpu001 not responding to slurmctld 60 s after the update "
        "(Slurm state DRAIN+IDLE+NOT_RESPONDING); left drained",
        True,
    )
    assert state.nodes["gpu001"].failed_phase is Phase.RESUMING
    assert "gpu001" not in fake.calls_of("resume")
    assert slurm(fake, "gpu001") == (["DRAIN", "IDLE", "NOT_RESPONDING"], REASON)
    # bounded: 13 reads in the wait (one per poll_interval_s over reboot_timeout_s), plus the
    # coordinator's own reads (the check before its drain, the failed-holds refresh)
    assert 13 <= fake.calls_of("slurm_node").count("gpu001") <= 18
    # it holds the only slot, so the rollout halts instead of taking gpu002 out too
    assert state.status is Status.HALTED
    assert state.nodes["gpu002"].phase is Phase.PENDING
    assert replay_audit(audit, 1, []).violations == []


def test_resumed_but_slurmd_gone_fails_the_node_not_drained(tmp_path: Path) -> None:
    fake = make_fake(names(1), scripts={"gpu001": Script(slurmd_lost_on_resume=True)})
    policy = Policy(max_unavailable=1, reboot_timeout_s=30, poll_interval_s=5)
    state, audit, _ = run(tmp_path, fake, policy)

    assert node_view(state, "gpu001") == (
        "failed",
        "resumed, but slurmd on gpu001 not responding to slurmctld 30 s later "
        "(Slurm state IDLE+NOT_RESPONDING)",
        False,
    )
    assert state.nodes["gpu001"].failed_phase is Phase.RESUMING
    assert fake.calls_of("resume") == ["gpu001"]
    assert event_sequence(audit, "gpu001")[-3:] == ["resuming", "resumed", "failed"]


def test_a_node_slurm_has_just_resumed_is_read_again_not_taken_for_down(tmp_path: Path) -> None:
    # the operator resumed gpu001 a moment ago: Slurm shows IDLE+NOT_RESPONDING until it
    # registers again (3 reads here); gpuctl looks again instead of leaving it as "down"
    fake = make_fake(names(2))
    fake.nodes["gpu001"].unregistered = 3
    slurm_seen, _ = read_nodes(fake, ["gpu001"], Component.DRIVER)  # what `plan` reads
    assert slurm_seen["gpu001"].responding
    fake.nodes["gpu001"].unregistered = 3
    plan = plan_for(fake, POLICY)
    assert planned(plan)["gpu001"].action is Action.UPDATE
    fake.nodes["gpu001"].unregistered = 3  # and again when the executor checks it
    state = Executor(fake, start(fake, tmp_path / "rollout", plan)).run()
    assert state.status is Status.DONE
    assert node_view(state, "gpu001") == ("done", "", False)
    assert fake.nodes["gpu001"].running[Component.DRIVER] == TARGET


def test_a_node_that_stays_not_responding_is_left_as_down(tmp_path: Path) -> None:
    fake = make_fake(names(2))
    fake.nodes["gpu002"].unregistered = -1
    plan = plan_for(fake, POLICY)
    assert planned(plan)["gpu002"].action is Action.LEAVE
    assert planned(plan)["gpu002"].reason == "down (IDLE+NOT_RESPONDING)"
    assert fake.count == 0  # plan_for reset the counters
    state = Executor(fake, start(fake, tmp_path / "rollout", plan)).run()
    assert state.nodes["gpu002"].phase is Phase.LEFT
    assert "gpu002" not in fake.calls_of("drain")


def test_threshold_halts_further_batches(tmp_path: Path) -> None:
    fake = make_fake(
        names(6),
        scripts={"gpu001": Script(apply_error=True), "gpu002": Script(validation_fail=True)},
    )
    policy = Policy(max_unavailable=3, failure_threshold=2, poll_interval_s=1)
    state, _, _ = run(tmp_path, fake, policy)

    assert state.status is Status.HALTED
    assert state.reason == "2 node(s) failed, failure_threshold is 2: gpu001, gpu002"
    assert state.nodes["gpu003"].phase is Phase.DONE  # same batch: it finished
    assert state.pending == ["gpu004", "gpu005", "gpu006"]
    assert sorted(fake.calls_of("drain")) == ["gpu001", "gpu002", "gpu003"]


def test_canary_runs_alone_first(tmp_path: Path) -> None:
    fake = make_fake(names(3), scripts={"gpu001": Script(apply_error=True)})
    policy = Policy(canary=1, max_unavailable=2, failure_threshold=1, poll_interval_s=1)
    state, _, _ = run(tmp_path, fake, policy)
    assert state.status is Status.HALTED
    assert fake.calls_of("drain") == ["gpu001"]


def test_a_canary_larger_than_max_unavailable_runs_in_waves(tmp_path: Path) -> None:
    fake = make_fake(names(3))
    state, audit, _ = run(tmp_path, fake, Policy(canary=3, max_unavailable=1, poll_interval_s=1))
    assert state.status is Status.DONE
    assert state.plan.batches == (("gpu001", "gpu002", "gpu003"),)
    assert replay_audit(audit, 1, []).peak == 1


def test_operator_redrain_with_another_reason_is_respected(tmp_path: Path) -> None:
    fake = make_fake(names(2))

    def operator(f: FakeBackend, method: str, node: str) -> None:
        if method == "validate" and node == "gpu001":
            f.nodes[node].reason = "operator: bad dimm"

    fake.hook = operator
    state, audit, _ = run(tmp_path, fake)

    assert node_view(state, "gpu001") == (
        "done",
        "left drained: reason changed by someone else (operator: bad dimm)",
        False,
    )
    assert slurm(fake, "gpu001") == (["DRAIN", "IDLE"], "operator: bad dimm")
    assert fake.calls_of("resume") == ["gpu002"]
    assert event_sequence(audit, "gpu001")[-2:] == ["released", "done"]
    # the slot went back: gpu002 (max_unavailable 1) was updated
    assert state.status is Status.DONE
    assert state.nodes["gpu002"].phase is Phase.DONE


def test_operator_redrain_during_a_drain_timeout_is_respected(tmp_path: Path) -> None:
    fake = make_fake(["gpu001"], scripts={"gpu001": Script(drain_timeout=True)})

    def operator(f: FakeBackend, method: str, node: str) -> None:
        if method == "jobs_on":
            f.nodes[node].reason = "operator: investigating"

    fake.hook = operator
    state, _, _ = run(tmp_path, fake, Policy(drain_timeout_s=3, poll_interval_s=1))
    assert node_view(state, "gpu001") == (
        "failed",
        "jobs still running after 3 s; left drained: reason changed by someone else "
        "(operator: investigating)",
        False,
    )
    assert fake.calls_of("resume") == []


def test_budget_is_never_exceeded_and_halts_when_failed_nodes_hold_it(tmp_path: Path) -> None:
    fake = make_fake(
        names(5),
        scripts={"gpu001": Script(validation_fail=True), "gpu003": Script(apply_error=True)},
    )
    policy = Policy(max_unavailable=2, failure_threshold=3, poll_interval_s=1)
    state, audit, _ = run(tmp_path, fake, policy)

    # batch 1: gpu001 fails (keeps its slot), gpu002 done; batch 2 has one slot: gpu003 fails
    assert sorted(fake.calls_of("drain")) == ["gpu001", "gpu002", "gpu003"]
    assert state.status is Status.HALTED
    assert state.reason == (
        "max_unavailable (2) is used up by failed nodes left drained: gpu001, gpu003"
    )
    assert state.pending == ["gpu004", "gpu005"]
    assert fake.max_gpuctl_drained == 2
    assert replay_audit(audit, 2, []).peak == 2

    # an operator fixes both and resumes them; continuing gives the slots back
    for node in ("gpu001", "gpu003"):
        fake.nodes[node].drained, fake.nodes[node].reason = False, None
    state = continue_rollout(fake, tmp_path / "rollout")
    assert state.status is Status.DONE
    assert state.failed == ["gpu001", "gpu003"]
    assert state.held == []
    audit = RolloutStore(tmp_path / "rollout").read_audit()
    assert [line["node"] for line in audit if line["event"] == "released"] == ["gpu001", "gpu003"]
    assert replay_audit(audit, 2, []).violations == []


def test_abort_lets_the_wave_finish_and_starts_nothing_new(tmp_path: Path) -> None:
    fake = make_fake(names(4))
    plan = plan_for(fake, Policy(max_unavailable=2, poll_interval_s=1))
    store = start(fake, tmp_path / "r", plan)

    def abort(_f: FakeBackend, method: str, node: str) -> None:
        if method == "apply" and node == "gpu001":
            RolloutStore(tmp_path / "r").request_abort("operator asked")

    fake.hook = abort
    state = Executor(fake, store).run()
    assert state.status is Status.ABORTED
    assert state.reason == "abort requested"
    assert [state.nodes[n].phase for n in names(4)] == [Phase.DONE] * 2 + [Phase.PENDING] * 2
    assert sorted(fake.calls_of("drain")) == ["gpu001", "gpu002"]
    events = event_sequence(store.read_audit(), None)
    assert events == ["planned", "started", "abort-requested", "aborted"]

    fake.hook = None
    assert continue_rollout(fake, tmp_path / "r").status is Status.ABORTED
    store.clear_abort()
    state = continue_rollout(fake, tmp_path / "r")
    assert state.status is Status.DONE
    assert all(s.phase is Phase.DONE for s in state.nodes.values())


def test_execution_time_checks_leave_skip_or_fail_nodes_changed_since_planning(
    tmp_path: Path,
) -> None:
    fake = make_fake(names(4))
    policy = Policy(max_unavailable=4, failure_threshold=4, poll_interval_s=1)
    plan = plan_for(fake, policy)
    fake.nodes["gpu001"].drained, fake.nodes["gpu001"].reason = True, FOREIGN_REASON
    fake.nodes["gpu002"].running[Component.DRIVER] = TARGET
    fake.nodes["gpu003"].script.versions_unreadable = True
    store = start(fake, tmp_path / "r", plan)
    state = Executor(fake, store).run()

    assert node_view(state, "gpu001") == (
        "left",
        f"drained by someone else: {FOREIGN_REASON}",
        False,
    )
    assert node_view(state, "gpu002") == ("skipped", f"already at {TARGET}", False)
    assert node_view(state, "gpu003") == (
        "failed",
        "gpu003: cannot read the driver version: exit status 2",
        False,
    )
    assert state.nodes["gpu003"].failed_phase is Phase.CHECKING
    assert fake.calls_of("drain") == ["gpu004"]
    assert slurm(fake, "gpu001") == (["DRAIN", "IDLE"], FOREIGN_REASON)
    assert state.status is Status.DONE


def test_planned_leaves_skips_and_problems_are_never_touched(tmp_path: Path) -> None:
    fake = make_fake(
        names(4),
        foreign=["gpu001"],
        down=["gpu002"],
        at_target=["gpu003"],
        scripts={"gpu004": Script(versions_unreadable=True)},
    )
    state, _, _ = run(tmp_path, fake)
    assert state.plan.batches == ()
    assert [str(s.phase) for s in state.nodes.values()] == ["left", "left", "skipped", "left"]
    assert state.nodes["gpu004"].reason.startswith("not updated, unknown when planned: ")
    assert [m for m, _ in fake.calls] == []
    assert state.status is Status.DONE


def test_policy_can_change_on_resume_but_not_its_batches(tmp_path: Path) -> None:
    fake = make_fake(names(2), scripts={"gpu001": Script(apply_error=True)})
    state, _, _ = run(tmp_path, fake)
    assert state.status is Status.HALTED
    store = RolloutStore(tmp_path / "rollout")
    with pytest.raises(PolicyError, match="fixed when a rollout is planned"):
        Executor(fake, store, policy=Policy(max_unavailable=2))
    raised = Policy(
        max_unavailable=1,
        failure_threshold=2,
        drain_timeout_s=100,
        reboot_timeout_s=1800,
        poll_interval_s=1,
        validate_level="quick",
    )
    state = Executor(fake, store, policy=raised).run()
    assert state.policy == raised
    # gpu001 still holds the one slot: the budget, not the threshold, stops it now
    assert state.status is Status.HALTED
    assert state.reason.startswith("max_unavailable (1) is used up")
    assert "policy-changed" in event_sequence(store.read_audit(), None)


def test_a_done_rollout_is_not_run_again(tmp_path: Path) -> None:
    fake = make_fake(["gpu001"])
    run(tmp_path, fake)
    calls = len(fake.calls)
    lines = len(RolloutStore(tmp_path / "rollout").read_audit())
    assert continue_rollout(fake, tmp_path / "rollout").status is Status.DONE
    assert len(fake.calls) == calls
    assert len(RolloutStore(tmp_path / "rollout").read_audit()) == lines


class Boom(Exception):
    pass


def test_a_bug_in_one_node_lets_the_wave_finish_then_propagates(tmp_path: Path) -> None:
    fake = make_fake(names(2))

    def bug(_f: FakeBackend, method: str, node: str) -> None:
        if method == "apply" and node == "gpu001":
            raise Boom("bug")

    fake.hook = bug
    plan = plan_for(fake, Policy(max_unavailable=2, poll_interval_s=1))
    store = start(fake, tmp_path / "r", plan)
    with pytest.raises(Boom):
        Executor(fake, store).run()
    state = store.load()
    assert state.status is Status.RUNNING
    assert state.nodes["gpu002"].phase is Phase.DONE
    assert state.nodes["gpu001"].phase is Phase.APPLYING
    fake.hook = None
    state = continue_rollout(fake, tmp_path / "r")
    assert state.status is Status.DONE
    assert fake.applies() == {"gpu001": 1, "gpu002": 1}


# --- kill -9 at every backend call, then resume from disk -----------------------------------

# (nodes, scripts, policy); the last node is drained by someone else
SCENARIOS: dict[str, tuple[int, dict[str, Script], Policy]] = {
    "mixed": (
        6,
        {
            "gpu001": Script(jobs_polls=2),
            "gpu002": Script(validation_fail=True),
            "gpu003": Script(drain_timeout=True),
            "gpu004": Script(apply_error=True),
            "gpu005": Script(wrong_version=True),
        },
        Policy(
            canary=1, max_unavailable=2, failure_threshold=5, drain_timeout_s=3, poll_interval_s=1
        ),
    ),
    # the node that halts the rollout is claimed first in its wave: the others of the wave must
    # still run after a resume (a wave is claimed in one write)
    "no-come-back": (
        4,
        {"gpu001": Script(no_come_back=True, jobs_polls=1)},
        Policy(max_unavailable=2, failure_threshold=3, poll_interval_s=1),
    ),
    "threshold": (
        7,
        {"gpu002": Script(apply_error=True), "gpu004": Script(validation_fail=True)},
        Policy(batch_size=3, failure_threshold=2, poll_interval_s=1),
    ),
}


def scenario_fake(scenario: str) -> tuple[FakeBackend, Policy, str]:
    n, scripts, policy = SCENARIOS[scenario]
    nodes = names(n)
    fake = make_fake(nodes, scripts=copy.deepcopy(scripts), foreign=[nodes[-1]])
    return fake, policy, nodes[-1]


def reference(tmp_path: Path, scenario: str) -> tuple[dict[str, Any], Any, int]:
    fake, policy, _ = scenario_fake(scenario)
    plan = plan_for(fake, policy)
    store = start(fake, tmp_path / "reference", plan)
    before = fake.count  # kill points are counted from here (run_with_kills arms after start)
    state = Executor(fake, store).run()
    return outcome(state), fake.snapshot(), fake.count - before


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_killed_at_any_call_and_resumed_ends_like_an_uninterrupted_run(
    tmp_path: Path, scenario: str
) -> None:
    """Every backend call and every store write is a kill point.

    Since every effect (backend change, file write) is a point, a kill after the effect of
    point k leaves the disk and the cluster as a kill before point k+1 does; the modes
    alternate, so every prefix is reached and both code paths run."""
    expected, expected_cluster, total = reference(tmp_path, scenario)
    checked = 0
    for at in range(1, total + 1):
        after = at % 2 == 0
        fake, policy, foreign = scenario_fake(scenario)
        plan = plan_for(fake, policy)
        directory = tmp_path / f"kill-{at}"
        state, kills = run_with_kills(fake, directory, plan, [(at, after)], durable=False)
        where = f"killed at point {at} ({'after' if after else 'before'} its effect)"
        assert kills == 1, where
        assert outcome(state) == expected, where
        assert fake.snapshot() == expected_cluster, where
        assert max(fake.applies().values()) <= 1, where
        audit = RolloutStore(directory).read_audit()
        replay = replay_audit(audit, plan.max_unavailable, [foreign])
        assert replay.violations == [], where
        assert replay.held == set(state.held), where
        checked += 1
    assert checked == total > 50


def test_killed_anywhere_with_the_staged_version_hidden_still_ends_at_target(
    tmp_path: Path,
) -> None:
    """HGX GPU firmware over Redfish: the staged version cannot be read. A kill between the
    flash and the power cycle must not leave a node "verified" at the old version: the resume
    power cycles (again). A kill during the flash itself may flash once more (nothing shows
    whether the first one finished); nothing is flashed more than twice."""
    policy = Policy(max_unavailable=2, failure_threshold=2, poll_interval_s=1)
    hidden = {n: Script(pending_hidden=True) for n in names(3)}

    def fresh() -> FakeBackend:
        return make_fake(names(3), component=Component.GPU_FIRMWARE, scripts=hidden)

    fake = fresh()
    plan = plan_for(fake, policy, component=Component.GPU_FIRMWARE)
    store = start(fake, tmp_path / "reference", plan)
    before = fake.count
    expected = outcome(Executor(fake, store).run())
    total = fake.count - before
    assert expected["status"] == "done"
    for at in range(1, total + 1):
        after = at % 2 == 0
        fake = fresh()
        plan = plan_for(fake, policy, component=Component.GPU_FIRMWARE)
        state, kills = run_with_kills(
            fake, tmp_path / f"kill-{at}", plan, [(at, after)], durable=False
        )
        where = f"killed at point {at} ({'after' if after else 'before'} its effect)"
        assert kills == 1, where
        assert outcome(state) == expected, where
        assert all(n.running[Component.GPU_FIRMWARE] == TARGET for n in fake.nodes.values()), where
        assert max(fake.applies().values()) <= 2, where
