"""Property test of the rollout executor: random clusters, policies, failures and kills.

Hypothesis draws 1-16 nodes (some drained by someone else, some down, some already at the
target, some misbehaving: jobs that never end, a failing flash, no come-back after the
restart, a failed validation, an unreadable version, the wrong version after the restart), a
policy (canary 0-3; max_unavailable as a count, a percentage or batch_size, or the default;
failure threshold 1-4) and up to three kill sequences of one to three kills each (every backend
call and every store write is a kill point, before or after its effect). The checks read the
audit log and the fake cluster, not the executor's variables:

* at no line of the audit log does gpuctl hold more than max_unavailable nodes out of service
  (drained and neither resumed nor released), and the fake cluster agrees;
* a node drained by someone else or down is never drained or resumed;
* no update is applied twice (audit and the fake's flash count);
* every node gpuctl drained and did not give back is in state.json as failed, with its reason;
* each node ends as its script says (or unstarted when the rollout halted);
* killed and resumed from disk, the rollout ends exactly like the uninterrupted one.

``GPUCTL_FUZZ_EXAMPLES`` raises the number of examples for a long local run; the default run is
derandomized (the same examples every time, so a red CI points at a reproducible input).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollout_fake import (
    FakeBackend,
    Script,
    make_fake,
    outcome,
    plan_for,
    replay_audit,
    run_with_kills,
    start,
)

from gpuctl.rollout.executor import Executor
from gpuctl.rollout.model import (
    RESTART_KIND,
    Component,
    Phase,
    Plan,
    Policy,
    Restart,
    RolloutState,
    Status,
    drain_reason,
)
from gpuctl.rollout.store import RolloutStore

SCALE = int(os.environ.get("GPUCTL_FUZZ_EXAMPLES", "0"))
DERANDOMIZE = SCALE == 0

KINDS = (
    ["ok"] * 6
    + ["foreign", "down", "at_target", "versions_unreadable"]
    + ["drain_timeout", "apply_error", "no_come_back", "validation_fail", "wrong_version"]
    + ["slurmd_late", "slurmd_never"]
)


@dataclass(frozen=True)
class Scenario:
    kinds: tuple[str, ...]
    jobs: tuple[int, ...]
    component: Component
    policy: Policy
    # kill sequences, each tried from the start: (point, after its effect) per kill; a point
    # is taken modulo the number of kill points of the uninterrupted run
    kills: tuple[tuple[tuple[int, bool], ...], ...]

    @property
    def names(self) -> list[str]:
        return [f"gpu{i:03d}" for i in range(1, len(self.kinds) + 1)]

    def of(self, kind: str) -> list[str]:
        return [n for n, k in zip(self.names, self.kinds, strict=True) if k == kind]

    def fake(self) -> FakeBackend:
        scripts = {}
        for name, kind, jobs in zip(self.names, self.kinds, self.jobs, strict=True):
            script = Script(jobs_polls=jobs)
            if hasattr(script, kind):
                setattr(script, kind, 3 if kind == "slurmd_late" else True)
            scripts[name] = script
        return make_fake(
            self.names,
            component=self.component,
            scripts=scripts,
            foreign=self.of("foreign"),
            down=self.of("down"),
            at_target=self.of("at_target"),
        )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, 16))
    kinds = tuple(draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n)))
    jobs = tuple(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    mode = draw(st.sampled_from(["count", "percent", "batch", "default"]))
    sizing: dict[str, int | str] = {}
    if mode == "count":
        sizing["max_unavailable"] = draw(st.integers(1, 4))
    elif mode == "percent":
        sizing["max_unavailable"] = f"{draw(st.integers(1, 60))}%"
    elif mode == "batch":
        sizing["batch_size"] = draw(st.integers(1, 4))
    policy = Policy(
        canary=draw(st.integers(0, 3)),
        failure_threshold=draw(st.integers(1, 4)),
        drain_timeout_s=10,
        reboot_timeout_s=600,
        poll_interval_s=1,
        validate_level="quick",
        **sizing,  # type: ignore[arg-type]
    )
    kill = st.tuples(st.integers(0, 2**32), st.booleans())
    kills = tuple(
        tuple(sequence)
        for sequence in draw(st.lists(st.lists(kill, min_size=1, max_size=3), max_size=3))
    )
    return Scenario(kinds, jobs, draw(st.sampled_from(list(Component))), policy, kills)


def expected_end(kind: str, component: Component) -> tuple[Phase, Phase | None] | None:
    """(phase, failed_phase) a node of this kind ends in once started; None: not started."""
    restarts = RESTART_KIND[component] is not Restart.NONE
    return {
        "ok": (Phase.DONE, None),
        "foreign": (Phase.LEFT, None),
        "down": (Phase.LEFT, None),
        "at_target": (Phase.SKIPPED, None),
        "versions_unreadable": (Phase.LEFT, None),
        "drain_timeout": (Phase.FAILED, Phase.WAITING_JOBS),
        "apply_error": (Phase.FAILED, Phase.APPLYING),
        "validation_fail": (Phase.FAILED, Phase.VALIDATING),
        # the BMC needs no restart: these scripts never trigger
        "no_come_back": (Phase.FAILED, Phase.WAITING_UP) if restarts else (Phase.DONE, None),
        "wrong_version": (Phase.FAILED, Phase.VERIFYING) if restarts else (Phase.DONE, None),
        "slurmd_late": (Phase.DONE, None),
        "slurmd_never": (Phase.FAILED, Phase.RESUMING) if restarts else (Phase.DONE, None),
    }[kind]


def check_run(
    scenario: Scenario, plan: Plan, state: RolloutState, fake: FakeBackend, directory: Path
) -> None:
    untouchable = set(scenario.of("foreign") + scenario.of("down"))
    audit = RolloutStore(directory).read_audit()
    replay = replay_audit(audit, plan.max_unavailable, untouchable)
    assert replay.violations == []
    assert fake.max_gpuctl_drained <= plan.max_unavailable
    for node in untouchable:
        assert node not in fake.calls_of("drain") + fake.calls_of("resume")
    assert max(fake.applies().values()) <= 1
    assert not any(n.resumed_unregistered for n in fake.nodes.values())

    # nodes gpuctl holds: the audit, state.json and Slurm agree, and each is a recorded failure
    ours = drain_reason(scenario.component, "2.0")
    in_slurm = {n for n, f in fake.nodes.items() if f.drained and f.reason == ours}
    assert replay.held == set(state.held) == in_slurm
    for node in state.held:
        assert state.nodes[node].phase is Phase.FAILED
        assert state.nodes[node].reason

    # every node ends as its script says, or unstarted when the rollout halted
    assert state.in_flight == []
    for name, kind in zip(scenario.names, scenario.kinds, strict=True):
        s = state.nodes[name]
        if s.phase is Phase.PENDING:
            assert state.status is Status.HALTED
            continue
        assert (s.phase, s.failed_phase) == expected_end(kind, scenario.component), name
        assert s.halts == (s.failed_phase is Phase.WAITING_UP)

    # the status follows from the failures
    failed = state.failed
    fatal = any(state.nodes[n].halts for n in failed)
    if fatal or len(failed) >= state.policy.failure_threshold:
        assert state.status is Status.HALTED
    if state.status is Status.HALTED:
        assert state.reason
    else:
        assert state.status is Status.DONE
        assert state.pending == []


@settings(
    max_examples=max(SCALE, 80),
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenario=scenarios())
def test_rollout_properties(scenario: Scenario) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fake = scenario.fake()
        plan = plan_for(fake, scenario.policy, component=scenario.component)
        store = start(fake, root / "reference", plan, durable=False)
        before = fake.count
        state = Executor(fake, store).run()
        total = fake.count - before
        check_run(scenario, plan, state, fake, root / "reference")
        if total == 0:
            return

        expected, cluster = outcome(state), fake.snapshot()
        for i, sequence in enumerate(scenario.kills):
            fake = scenario.fake()
            plan = plan_for(fake, scenario.policy, component=scenario.component)
            kills = [(1 + at % total, after) for at, after in sequence]
            directory = root / f"killed-{i}"
            state, killed = run_with_kills(fake, directory, plan, kills, durable=False)
            assert killed >= 1
            assert outcome(state) == expected
            assert fake.snapshot() == cluster
            check_run(scenario, plan, state, fake, directory)
