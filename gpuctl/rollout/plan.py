"""The rollout planner: a pure function from what was read off the cluster to a :class:`Plan`.

Decisions, per node in the given order:

1. No Slurm state read: ``unknown`` (a problem).
2. Someone else has it (drained, down, or in another administrative state): ``leave``. This
   comes before the version check because the version of a down node usually cannot be read,
   and a down node is not a problem of the rollout.
3. Version not read, unreadable (a :class:`BackendError`) or running version unknown:
   ``unknown`` (fail closed: never taken for "at target", never updated blindly). These are
   listed in ``Plan.problems``.
4. Running the target: ``skip``. Otherwise ``update``.

Batches hold the ``update`` nodes in order: first the canary batch (the first ``canary`` of
them, one batch), then batches of ``max_unavailable`` nodes (``batch_size`` when that is given).
A canary batch larger than ``max_unavailable`` is run in waves of at most ``max_unavailable``
by the executor, which never exceeds that number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuctl.rollout.backend import BackendError, Versions
from gpuctl.rollout.model import (
    Action,
    Component,
    NodePlan,
    Plan,
    Policy,
    RolloutError,
    resolve_max_unavailable,
)
from gpuctl.slurm import SlurmNode


def _chunks(items: Sequence[str], size: int) -> list[tuple[str, ...]]:
    return [tuple(items[i : i + size]) for i in range(0, len(items), size)]


def plan_node(
    node: str,
    slurm: SlurmNode | None,
    versions: Versions | BackendError | None,
    target: str,
) -> NodePlan:
    """The plan for one node (the rules in the module docstring)."""
    current = versions.running if isinstance(versions, Versions) else None
    if slurm is None:
        return NodePlan(node, Action.UNKNOWN, current, "Slurm state not read")
    hold = slurm.hold_reason()
    if hold is not None:
        return NodePlan(node, Action.LEAVE, current, hold)
    if versions is None:
        return NodePlan(node, Action.UNKNOWN, None, "version not read")
    if isinstance(versions, BackendError):
        return NodePlan(node, Action.UNKNOWN, None, f"version unreadable: {versions}")
    if versions.running is None:
        return NodePlan(node, Action.UNKNOWN, None, "running version unknown")
    if versions.running == target:
        return NodePlan(node, Action.SKIP, current, f"already at {target}")
    return NodePlan(node, Action.UPDATE, current)


def plan_rollout(
    nodes: Sequence[str],
    slurm: Mapping[str, SlurmNode],
    versions: Mapping[str, Versions | BackendError],
    component: Component,
    target: str,
    policy: Policy,
) -> Plan:
    """Plan updating ``component`` to ``target`` on ``nodes`` (the rollout's scope, in order).

    ``slurm`` and ``versions`` are what the caller read for each node; a missing entry is
    planned ``unknown``. Raises :class:`RolloutError` for a node named twice or an empty target.
    """
    if not target.strip():
        raise RolloutError("the target version is empty")
    seen: set[str] = set()
    entries: list[NodePlan] = []
    for node in nodes:
        if node in seen:
            raise RolloutError(f"{node} is named twice")
        seen.add(node)
        entries.append(plan_node(node, slurm.get(node), versions.get(node), target))
    max_unavailable = resolve_max_unavailable(policy, len(entries))
    updates = [e.node for e in entries if e.action is Action.UPDATE]
    batches: list[tuple[str, ...]] = []
    if policy.canary > 0 and updates:
        batches.append(tuple(updates[: policy.canary]))
        updates = updates[policy.canary :]
    batches.extend(_chunks(updates, max_unavailable))
    return Plan(
        component=component,
        target=target,
        policy=policy,
        in_scope=len(entries),
        max_unavailable=max_unavailable,
        nodes=tuple(entries),
        batches=tuple(batches),
    )
