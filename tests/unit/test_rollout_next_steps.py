"""What `gpuctl rollout` tells an operator to do after a halt (gpuctl.rollout.run.next_steps):
each step it names is needed, and doing them is enough for the resume not to halt again."""

from __future__ import annotations

from pathlib import Path

from rollout_fake import FakeBackend, Script, continue_rollout, make_fake, plan_for, start

from gpuctl.rollout.executor import Executor
from gpuctl.rollout.model import Component, Policy, RolloutState, Status
from gpuctl.rollout.run import next_steps

NODES = ("gpu001", "gpu002", "gpu003", "gpu004")


def _halted(
    tmp_path: Path, policy: Policy, failing: tuple[str, ...]
) -> tuple[FakeBackend, RolloutState]:
    fake = make_fake(NODES, scripts={n: Script(validation_fail=True) for n in failing})
    store = start(fake, tmp_path / "r", plan_for(fake, policy))
    state = Executor(fake, store).run()
    assert state.status is Status.HALTED, state.reason
    return fake, state


def test_threshold_reached_names_a_higher_threshold_only(tmp_path: Path) -> None:
    policy = Policy(canary=0, max_unavailable=2, failure_threshold=1, poll_interval_s=1)
    _, state = _halted(tmp_path, policy, ("gpu001",))
    steps = next_steps(state, "c.yml")
    assert steps == [
        "gpuctl rollout resume c.yml --failure-threshold 2  (1 node(s) failed and "
        "failure_threshold is 1; a failed node counts for good)"
    ]


def test_slots_used_up_names_the_nodes_to_return_to_service_only(tmp_path: Path) -> None:
    policy = Policy(canary=0, max_unavailable=1, failure_threshold=3, poll_interval_s=1)
    fake, state = _halted(tmp_path, policy, ("gpu001",))
    steps = next_steps(state, "c.yml")
    assert len(steps) == 2
    assert steps[0].startswith("repair gpu001, then return it to service in Slurm: scontrol ")
    assert steps[1] == "gpuctl rollout resume c.yml"
    # doing step 1 is enough: the resume goes on with the other nodes
    node = fake.nodes["gpu001"]
    node.drained, node.reason, node.script.validation_fail = False, None, False
    final = continue_rollout(fake, tmp_path / "r")
    assert final.status is Status.DONE
    assert next_steps(final, "c.yml") == []


def test_done_and_interrupted(tmp_path: Path) -> None:
    policy = Policy(canary=0, max_unavailable=4, failure_threshold=1, poll_interval_s=1)
    fake = make_fake(NODES)
    store = start(fake, tmp_path / "r", plan_for(fake, policy, component=Component.DRIVER))
    state = store.load()
    state.status = Status.RUNNING  # what a kill -9 leaves
    assert next_steps(state, "c.yml") == ["gpuctl rollout resume c.yml"]
    assert next_steps(Executor(fake, store).run(), "c.yml") == []
