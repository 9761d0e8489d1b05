"""The rollout planner and the policy: batches, skips, leaves, problems, max_unavailable."""

from __future__ import annotations

import pytest

from gpuctl.rollout.backend import BackendError, Versions
from gpuctl.rollout.model import (
    RESTART_KIND,
    Action,
    Component,
    Plan,
    Policy,
    PolicyError,
    Restart,
    RolloutError,
    resolve_max_unavailable,
)
from gpuctl.rollout.plan import plan_rollout
from gpuctl.slurm import SlurmNode

IDLE = SlurmNode(frozenset({"IDLE"}))


def names(n: int) -> list[str]:
    return [f"gpu{i:03d}" for i in range(1, n + 1)]


def plan(
    nodes: list[str],
    policy: Policy,
    *,
    slurm: dict[str, SlurmNode] | None = None,
    versions: dict[str, Versions | BackendError] | None = None,
    target: str = "2.0",
) -> Plan:
    slurm_all = dict.fromkeys(nodes, IDLE) | (slurm or {})
    versions_all: dict[str, Versions | BackendError] = {n: Versions("1.0") for n in nodes}
    versions_all |= versions or {}
    return plan_rollout(nodes, slurm_all, versions_all, Component.DRIVER, target, policy)


def test_restart_kind_per_component() -> None:
    assert dict(RESTART_KIND) == {
        Component.DRIVER: Restart.REBOOT,
        Component.NIC_FIRMWARE: Restart.REBOOT,
        Component.GPU_FIRMWARE: Restart.POWER_CYCLE,
        Component.BMC_FIRMWARE: Restart.NONE,
    }


def test_canary_then_batches_of_a_count() -> None:
    p = plan(names(8), Policy(canary=2, max_unavailable=3))
    assert p.max_unavailable == 3
    assert p.batches == (
        ("gpu001", "gpu002"),
        ("gpu003", "gpu004", "gpu005"),
        ("gpu006", "gpu007", "gpu008"),
    )


def test_percentage_resolves_against_the_scope_rounded_down() -> None:
    # 25% of 10 nodes in scope is 2.5: two at a time
    p = plan(names(10), Policy(max_unavailable="25%"))
    assert p.max_unavailable == 2
    assert [len(b) for b in p.batches] == [2, 2, 2, 2, 2]


def test_percentage_counts_nodes_that_are_not_updated_and_is_at_least_one() -> None:
    nodes = names(10)
    at_target: dict[str, Versions | BackendError] = {n: Versions("2.0") for n in nodes[2:]}
    p = plan(nodes, Policy(max_unavailable="20%"), versions=at_target)
    assert p.in_scope == 10
    assert p.max_unavailable == 2
    assert p.batches == (("gpu001", "gpu002"),)
    assert plan(names(3), Policy(max_unavailable="10%")).max_unavailable == 1


def test_batch_size_is_also_max_unavailable() -> None:
    p = plan(names(5), Policy(canary=1, batch_size=2))
    assert p.max_unavailable == 2
    assert p.batches == (("gpu001",), ("gpu002", "gpu003"), ("gpu004", "gpu005"))


def test_one_at_a_time_when_nothing_is_given() -> None:
    p = plan(names(3), Policy())
    assert p.max_unavailable == 1
    assert p.batches == (("gpu001",), ("gpu002",), ("gpu003",))


def test_no_canary_batch_when_canary_is_zero() -> None:
    p = plan(names(4), Policy(canary=0, max_unavailable=2))
    assert p.batches == (("gpu001", "gpu002"), ("gpu003", "gpu004"))


def test_canary_larger_than_the_updates_is_one_batch() -> None:
    p = plan(names(2), Policy(canary=3, max_unavailable=1))
    assert p.batches == (("gpu001", "gpu002"),)


def test_skip_leave_and_update_in_the_given_order() -> None:
    nodes = ["gpu004", "gpu001", "gpu003", "gpu002", "gpu005"]
    p = plan(
        nodes,
        Policy(canary=1, max_unavailable=2),
        slurm={
            "gpu003": SlurmNode(frozenset({"MIXED", "DRAIN"}), "hw ticket 4711"),
            "gpu005": SlurmNode(frozenset({"DOWN"}), "Not responding"),
        },
        versions={"gpu001": Versions("2.0"), "gpu005": BackendError("gpu005: unreachable")},
    )
    got = {e.node: (e.action, e.current, e.reason) for e in p.nodes}
    assert [e.node for e in p.nodes] == nodes
    assert got == {
        "gpu004": (Action.UPDATE, "1.0", ""),
        "gpu001": (Action.SKIP, "2.0", "already at 2.0"),
        "gpu003": (Action.LEAVE, "1.0", "drained by someone else: hw ticket 4711"),
        # down comes before the version: a down node is left, not a problem
        "gpu005": (Action.LEAVE, None, "down (DOWN): Not responding"),
        "gpu002": (Action.UPDATE, "1.0", ""),
    }
    assert p.batches == (("gpu004",), ("gpu002",))
    assert p.problems == ()


def test_drained_without_reason_and_other_admin_states_are_left() -> None:
    p = plan(
        names(3),
        Policy(),
        slurm={
            "gpu001": SlurmNode(frozenset({"idle", "drained"})),
            "gpu002": SlurmNode(frozenset({"IDLE", "MAINT"})),
            "gpu003": SlurmNode(frozenset({"IDLE", "NOT_RESPONDING"})),
        },
    )
    assert [(e.action, e.reason) for e in p.nodes] == [
        (Action.LEAVE, "drained by someone else (no reason given)"),
        (Action.LEAVE, "not in service (IDLE+MAINT)"),
        (Action.LEAVE, "down (IDLE+NOT_RESPONDING)"),
    ]
    assert p.batches == ()


def test_unreadable_or_unknown_version_is_a_problem_not_an_update() -> None:
    nodes = names(4)
    p = plan(
        nodes,
        Policy(max_unavailable=4),
        versions={
            "gpu001": BackendError("gpu001: nvidia-smi: exit status 9"),
            "gpu002": Versions(None, "2.0"),
        },
        slurm={},
    )
    assert [(e.node, e.action) for e in p.problems] == [
        ("gpu001", Action.UNKNOWN),
        ("gpu002", Action.UNKNOWN),
    ]
    assert p.problems[0].reason == "version unreadable: gpu001: nvidia-smi: exit status 9"
    assert p.problems[1].reason == "running version unknown"
    assert p.batches == (("gpu003", "gpu004"),)


def test_missing_readings_are_problems() -> None:
    p = plan_rollout(
        ["gpu001", "gpu002"],
        {"gpu002": IDLE},
        {},
        Component.NIC_FIRMWARE,
        "28.39",
        Policy(),
    )
    assert [(e.action, e.reason) for e in p.nodes] == [
        (Action.UNKNOWN, "Slurm state not read"),
        (Action.UNKNOWN, "version not read"),
    ]


def test_a_node_named_twice_or_an_empty_target_is_refused() -> None:
    with pytest.raises(RolloutError, match="gpu001 is named twice"):
        plan(["gpu001", "gpu002", "gpu001"], Policy())
    with pytest.raises(RolloutError, match="target version is empty"):
        plan(["gpu001"], Policy(), target=" ")


def test_plan_json_round_trips_with_stable_keys() -> None:
    p = plan(names(3), Policy(canary=1, max_unavailable="50%"), versions={"gpu002": Versions(None)})
    data = p.to_json()
    assert list(data) == [
        "component",
        "target",
        "in_scope",
        "max_unavailable",
        "policy",
        "nodes",
        "batches",
        "problems",
    ]
    assert data["batches"] == [["gpu001"], ["gpu003"]]
    assert data["problems"] == [
        {
            "node": "gpu002",
            "action": "unknown",
            "current": None,
            "reason": "running version unknown",
        }
    ]
    assert Plan.from_json(data) == p


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"canary": -1}, "canary: expected a count >= 0"),
        ({"batch_size": 0}, "batch_size: expected a count >= 1"),
        ({"batch_size": 2, "max_unavailable": 2}, "exclusive"),
        ({"max_unavailable": "0%"}, "max_unavailable: expected"),
        ({"max_unavailable": "150%"}, "max_unavailable: expected"),
        ({"max_unavailable": "ten"}, "max_unavailable: expected"),
        ({"max_unavailable": 0}, "max_unavailable: expected"),
        ({"max_unavailable": True}, "max_unavailable: expected"),
        ({"failure_threshold": 0}, "failure_threshold: expected a count >= 1"),
        ({"drain_timeout_s": 0}, "drain_timeout_s: expected a number of seconds > 0"),
        ({"poll_interval_s": -1.0}, "poll_interval_s"),
        ({"validate_level": "thorough"}, "validate_level: expected one of quick, standard, long"),
    ],
)
def test_invalid_policies_are_refused_naming_the_field(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "in_scope", "expected"),
    [
        (Policy(), 100, 1),
        (Policy(max_unavailable=7), 3, 7),
        (Policy(max_unavailable="7"), 3, 7),
        (Policy(max_unavailable="10%"), 128, 12),
        (Policy(max_unavailable="10%"), 9, 1),
        (Policy(max_unavailable="100%"), 9, 9),
        (Policy(batch_size=4), 100, 4),
    ],
)
def test_resolve_max_unavailable(policy: Policy, in_scope: int, expected: int) -> None:
    assert resolve_max_unavailable(policy, in_scope) == expected


def test_policy_json_round_trips() -> None:
    policy = Policy(canary=2, max_unavailable="10%", failure_threshold=3, poll_interval_s=0.5)
    assert Policy.from_json(policy.to_json()) == policy
    with pytest.raises(RolloutError, match="unknown keys password"):
        Policy.from_json({**policy.to_json(), "password": "x"})
