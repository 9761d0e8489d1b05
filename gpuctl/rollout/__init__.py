"""`gpuctl rollout`: firmware and driver updates, node by node, on a live Slurm cluster.

The pure core: :func:`plan_rollout` decides, :class:`Executor` carries a plan out through a
:class:`Backend` (the only place with side effects), :class:`RolloutStore` keeps state.json and
audit.jsonl so that a killed rollout continues where it stopped. No SSH, Slurm or CLI here.
"""

from gpuctl.rollout.backend import (
    Backend,
    BackendError,
    ValidationOutcome,
    Versions,
)
from gpuctl.rollout.executor import Executor
from gpuctl.rollout.model import (
    RESTART_KIND,
    Action,
    AuditEvent,
    Component,
    NodePlan,
    NodeState,
    Phase,
    Plan,
    Policy,
    PolicyError,
    Restart,
    RolloutError,
    RolloutLocked,
    RolloutState,
    Status,
    drain_reason,
    resolve_max_unavailable,
)
from gpuctl.rollout.plan import plan_node, plan_rollout
from gpuctl.rollout.store import (
    RolloutStore,
    cluster_lock,
    current_rollout,
    new_rollout,
    new_rollout_id,
    rollouts_root,
)

__all__ = [
    "RESTART_KIND",
    "Action",
    "AuditEvent",
    "Backend",
    "BackendError",
    "Component",
    "Executor",
    "NodePlan",
    "NodeState",
    "Phase",
    "Plan",
    "Policy",
    "PolicyError",
    "Restart",
    "RolloutError",
    "RolloutLocked",
    "RolloutState",
    "RolloutStore",
    "Status",
    "ValidationOutcome",
    "Versions",
    "cluster_lock",
    "current_rollout",
    "drain_reason",
    "new_rollout",
    "new_rollout_id",
    "plan_node",
    "plan_rollout",
    "resolve_max_unavailable",
    "rollouts_root",
]
