"""Data of `gpuctl rollout`: components, policy, plan and per-node progress, with their JSON form.

Everything here is a value: enums, frozen dataclasses and the one mutable container the executor
updates (:class:`RolloutState`). The JSON written by ``to_json`` uses fixed key names (they are
read by ``jq`` and by the CLI's ``--json``); ``from_json`` reads them back and raises
:class:`RolloutError` for anything it does not recognise.

Policy decisions made here:

* ``max_unavailable`` and ``batch_size`` are exclusive; when neither is given one node at a time
  is taken out of service (``max_unavailable = 1``). A percentage is resolved by the planner
  against the number of nodes in the rollout's scope, rounded down, never below 1.
* ``failure_threshold`` defaults to 1: the first failed node stops the rollout from starting
  any other node. A node that does not come back after a reboot or power cycle stops it whatever
  the threshold.
* ``validate_level`` defaults to ``"standard"``: a node goes back into service only after the
  same checks ``gpuctl validate --level standard`` runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from gpuctl.config.model import LEVELS
from gpuctl.errors import GpuctlError

SCHEMA = 1
VALIDATE_LEVELS = tuple(lvl for lvl in LEVELS if lvl != "burn")  # burn: asked for by hand


class RolloutError(GpuctlError):
    """A rollout cannot be planned, loaded or continued as asked."""


class PolicyError(RolloutError):
    """A rollout policy (cluster.yml's ``rollout:`` section plus CLI flags) is invalid."""


class RolloutLocked(RolloutError):
    """Another gpuctl process holds the cluster's rollout lock."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "a process whose pid could not be read"
        super().__init__(
            f"another gpuctl rollout is running on this cluster ({holder} holds {path})"
        )


class Component(StrEnum):
    """What a rollout updates."""

    GPU_FIRMWARE = "gpu-firmware"
    NIC_FIRMWARE = "nic-firmware"
    BMC_FIRMWARE = "bmc-firmware"
    DRIVER = "driver"


class Restart(StrEnum):
    """What makes a new version active on a node."""

    NONE = "none"
    REBOOT = "reboot"
    POWER_CYCLE = "power-cycle"


RESTART_KIND: Mapping[Component, Restart] = MappingProxyType(
    {
        Component.DRIVER: Restart.REBOOT,
        Component.NIC_FIRMWARE: Restart.REBOOT,
        # GPU firmware is only loaded when the GPUs lose power; a warm reboot keeps the old one
        Component.GPU_FIRMWARE: Restart.POWER_CYCLE,
        # the BMC resets itself after a flash; the host stays up
        Component.BMC_FIRMWARE: Restart.NONE,
    }
)


def drain_reason(component: Component, target: str) -> str:
    """The Slurm reason gpuctl drains a node with; a node with any other reason is not gpuctl's."""
    return f"gpuctl rollout: {component} {target}"


def seconds(value: float) -> str:
    """``1800.0`` -> ``"1800"``, ``0.5`` -> ``"0.5"`` (for messages)."""
    return f"{value:g}"


# --- policy ----------------------------------------------------------------------------------

_PERCENT = re.compile(r"^\s*(\d{1,3})\s*%\s*$")
_COUNT = re.compile(r"^\s*(\d+)\s*$")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Policy:
    """How a rollout proceeds. Built by the CLI from cluster.yml's ``rollout:`` and its flags.

    ``max_unavailable`` is a count (``3``, ``"3"``) or a percentage string (``"10%"``);
    ``batch_size`` is a count and, when given, is also the number of nodes out of service at once.
    Invalid values raise :class:`PolicyError` naming the field.
    """

    canary: int = 0
    batch_size: int | None = None
    max_unavailable: int | str | None = None
    failure_threshold: int = 1
    drain_timeout_s: float = 3600.0
    reboot_timeout_s: float = 1800.0
    validate_level: str = "standard"
    poll_interval_s: float = 5.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not _is_int(self.canary) or self.canary < 0:
            problems.append(f"canary: expected a count >= 0, got {self.canary!r}")
        if self.batch_size is not None and (not _is_int(self.batch_size) or self.batch_size < 1):
            problems.append(f"batch_size: expected a count >= 1, got {self.batch_size!r}")
        if self.max_unavailable is not None:
            if self.batch_size is not None:
                problems.append("max_unavailable and batch_size are exclusive: give one of them")
            if _max_unavailable_kind(self.max_unavailable) is None:
                problems.append(
                    "max_unavailable: expected a count >= 1 or a percentage like '10%', "
                    f"got {self.max_unavailable!r}"
                )
        if not _is_int(self.failure_threshold) or self.failure_threshold < 1:
            problems.append(
                f"failure_threshold: expected a count >= 1, got {self.failure_threshold!r}"
            )
        for name in ("drain_timeout_s", "reboot_timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                problems.append(f"{name}: expected a number of seconds > 0, got {value!r}")
        if self.validate_level not in VALIDATE_LEVELS:
            problems.append(
                f"validate_level: expected one of {', '.join(VALIDATE_LEVELS)}, "
                f"got {self.validate_level!r}"
            )
        if problems:
            raise PolicyError("; ".join(problems))

    def same_batches(self, other: Policy) -> bool:
        """Whether ``other`` cuts the same batches (canary, batch_size, max_unavailable)."""
        return (self.canary, self.batch_size, self.max_unavailable) == (
            other.canary,
            other.batch_size,
            other.max_unavailable,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "canary": self.canary,
            "batch_size": self.batch_size,
            "max_unavailable": self.max_unavailable,
            "failure_threshold": self.failure_threshold,
            "drain_timeout_s": self.drain_timeout_s,
            "reboot_timeout_s": self.reboot_timeout_s,
            "validate_level": self.validate_level,
            "poll_interval_s": self.poll_interval_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Policy:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise RolloutError(f"policy: unknown keys {', '.join(unknown)}")
        return cls(**data)


def _max_unavailable_kind(value: int | str) -> tuple[str, int] | None:
    """``("count", n)`` or ``("percent", p)``; None when ``value`` is neither."""
    if isinstance(value, int) and not isinstance(value, bool):
        return ("count", value) if value >= 1 else None
    if isinstance(value, str):
        if m := _PERCENT.match(value):
            pct = int(m.group(1))
            return ("percent", pct) if 1 <= pct <= 100 else None
        if (m := _COUNT.match(value)) and int(m.group(1)) >= 1:
            return ("count", int(m.group(1)))
    return None


def resolve_max_unavailable(policy: Policy, in_scope: int) -> int:
    """The number of nodes gpuctl may hold out of service at once.

    ``batch_size`` when given; a count as is; a percentage of ``in_scope`` (every node named for
    the rollout, whatever its plan), rounded down and at least 1; 1 when nothing is given.
    """
    if policy.batch_size is not None:
        return policy.batch_size
    if policy.max_unavailable is None:
        return 1
    kind = _max_unavailable_kind(policy.max_unavailable)
    if kind is None:  # pragma: no cover - Policy.__post_init__ refuses these
        raise PolicyError(f"max_unavailable: invalid value {policy.max_unavailable!r}")
    what, n = kind
    if what == "count":
        return n
    return max(1, in_scope * n // 100)


# --- plan ------------------------------------------------------------------------------------


class Action(StrEnum):
    """What the planner decided for one node."""

    UPDATE = "update"
    SKIP = "skip"  # already running the target
    LEAVE = "leave"  # drained by someone else, or down: never touched
    UNKNOWN = "unknown"  # its version or Slurm state could not be read: not touched, a problem


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: str
    action: Action
    current: str | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action": str(self.action),
            "current": self.current,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodePlan:
        return cls(
            node=str(data["node"]),
            action=Action(data["action"]),
            current=_opt_str(data.get("current")),
            reason=str(data.get("reason", "")),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer: one entry per node in the given order, and the batches.

    ``batches`` name only nodes planned for update; the first is the canary batch when
    ``policy.canary > 0``. ``max_unavailable`` is resolved to a count. ``problems`` are the
    nodes whose state could not be read (planned ``unknown``, left out): the CLI exits non-zero
    when there are any.
    """

    component: Component
    target: str
    policy: Policy
    in_scope: int
    max_unavailable: int
    nodes: tuple[NodePlan, ...]
    batches: tuple[tuple[str, ...], ...]

    @property
    def problems(self) -> tuple[NodePlan, ...]:
        return tuple(n for n in self.nodes if n.action is Action.UNKNOWN)

    @property
    def updates(self) -> tuple[str, ...]:
        return tuple(n.node for n in self.nodes if n.action is Action.UPDATE)

    def to_json(self) -> dict[str, Any]:
        return {
            "component": str(self.component),
            "target": self.target,
            "in_scope": self.in_scope,
            "max_unavailable": self.max_unavailable,
            "policy": self.policy.to_json(),
            "nodes": [n.to_json() for n in self.nodes],
            "batches": [list(b) for b in self.batches],
            "problems": [n.to_json() for n in self.problems],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            component=Component(data["component"]),
            target=str(data["target"]),
            policy=Policy.from_json(data["policy"]),
            in_scope=int(data["in_scope"]),
            max_unavailable=int(data["max_unavailable"]),
            nodes=tuple(NodePlan.from_json(n) for n in data["nodes"]),
            batches=tuple(tuple(str(x) for x in b) for b in data["batches"]),
        )


# --- execution state -------------------------------------------------------------------------


class Status(StrEnum):
    """A rollout's status.

    ``done``: every node is done, skipped, left or failed, and no halt condition holds; nodes
    that failed below the threshold are listed in ``RolloutState.failed`` (``"failed"`` in
    state.json), so ``done`` with a non-empty ``failed`` list means "finished, with failures".
    ``halted``: the failure threshold was reached, a node did not come back, or max_unavailable
    is used up by failed nodes left drained. ``aborted``: an abort was requested and nodes
    were left unstarted.
    """

    PLANNED = "planned"
    RUNNING = "running"
    HALTED = "halted"
    ABORTED = "aborted"
    DONE = "done"


class Phase(StrEnum):
    """Where one node is. In-flight phases are written *before* their side effect."""

    PENDING = "pending"
    CHECKING = (
        "checking"  # reading Slurm state and versions; never persisted except as failed_phase
    )
    DRAINING = "draining"
    WAITING_JOBS = "waiting-jobs"
    APPLYING = "applying"
    RESTARTING = "restarting"
    WAITING_UP = "waiting-up"
    VERIFYING = "verifying"
    VALIDATING = "validating"
    RESUMING = "resuming"
    DONE = "done"
    SKIPPED = "skipped"
    LEFT = "left"
    FAILED = "failed"


TERMINAL: frozenset[Phase] = frozenset({Phase.DONE, Phase.SKIPPED, Phase.LEFT, Phase.FAILED})
IN_FLIGHT: frozenset[Phase] = frozenset(
    {
        Phase.DRAINING,
        Phase.WAITING_JOBS,
        Phase.APPLYING,
        Phase.RESTARTING,
        Phase.WAITING_UP,
        Phase.VERIFYING,
        Phase.VALIDATING,
        Phase.RESUMING,
    }
)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node's progress.

    ``drained`` is True while gpuctl holds the node out of service: from the moment it decided
    to drain it (written before the drain) until it resumed it or gave it up to someone else.
    A failed node keeps ``drained`` when it was left drained; it then uses one max_unavailable
    slot. ``reason`` explains a terminal phase (empty for a plain ``done``); ``failed_phase``
    is the phase a failed node failed in; ``halts`` marks a failure that stops the rollout
    whatever the threshold (a node that did not come back), until an operator continues the
    halted rollout (which acknowledges it).
    """

    node: str
    phase: Phase
    batch: int | None = None
    from_version: str | None = None
    drained: bool = False
    reason: str = ""
    failed_phase: Phase | None = None
    halts: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": str(self.phase),
            "batch": self.batch,
            "from_version": self.from_version,
            "drained": self.drained,
            "reason": self.reason,
            "failed_phase": None if self.failed_phase is None else str(self.failed_phase),
            "halts": self.halts,
        }

    @classmethod
    def from_json(cls, node: str, data: Mapping[str, Any]) -> NodeState:
        failed_phase = data.get("failed_phase")
        batch = data.get("batch")
        return cls(
            node=node,
            phase=Phase(data["phase"]),
            batch=None if batch is None else int(batch),
            from_version=_opt_str(data.get("from_version")),
            drained=bool(data.get("drained", False)),
            reason=str(data.get("reason", "")),
            failed_phase=None if failed_phase is None else Phase(failed_phase),
            halts=bool(data.get("halts", False)),
        )


@dataclass(slots=True)
class RolloutState:
    """What state.json holds: the plan, the policy in force, the status and every node.

    The executor replaces entries of ``nodes`` (each a frozen :class:`NodeState`) and writes the
    whole object after every change. ``audit_seq`` and ``outbox`` tie it to audit.jsonl: every
    change is saved together with the audit lines that describe it (numbered by ``seq``), and
    those lines are appended after the save; a process killed in between leaves them in the
    outbox, and the next executor appends the ones audit.jsonl lacks
    (:meth:`gpuctl.rollout.store.RolloutStore.complete_audit`).
    """

    rollout_id: str
    plan: Plan
    policy: Policy
    status: Status
    nodes: dict[str, NodeState]
    reason: str = ""
    created: str = ""
    updated: str = ""
    audit_seq: int = 0
    outbox: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def new(cls, rollout_id: str, plan: Plan, created: str) -> RolloutState:
        """The state of a rollout that has not started: planned skips and leaves are final."""
        batch_of = {node: i for i, batch in enumerate(plan.batches) for node in batch}
        nodes: dict[str, NodeState] = {}
        for entry in plan.nodes:
            if entry.action is Action.UPDATE:
                nodes[entry.node] = NodeState(
                    entry.node, Phase.PENDING, batch_of.get(entry.node), entry.current
                )
            elif entry.action is Action.SKIP:
                nodes[entry.node] = NodeState(
                    entry.node, Phase.SKIPPED, from_version=entry.current, reason=entry.reason
                )
            else:
                reason = entry.reason
                if entry.action is Action.UNKNOWN:
                    reason = f"not updated, unknown when planned: {reason}"
                nodes[entry.node] = NodeState(
                    entry.node, Phase.LEFT, from_version=entry.current, reason=reason
                )
        return cls(rollout_id, plan, plan.policy, Status.PLANNED, nodes, "", created, created)

    def in_phase(self, *phases: Phase) -> list[str]:
        return [n for n, s in self.nodes.items() if s.phase in phases]

    @property
    def failed(self) -> list[str]:
        return self.in_phase(Phase.FAILED)

    @property
    def held(self) -> list[str]:
        """Nodes gpuctl holds out of service (in flight, or failed and left drained)."""
        return [n for n, s in self.nodes.items() if s.drained]

    @property
    def pending(self) -> list[str]:
        return self.in_phase(Phase.PENDING)

    @property
    def in_flight(self) -> list[str]:
        return [n for n, s in self.nodes.items() if s.phase in IN_FLIGHT]

    def counts(self) -> dict[str, int]:
        out = {str(p): 0 for p in Phase if p is not Phase.CHECKING}
        for s in self.nodes.values():
            out[str(s.phase)] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "rollout": self.rollout_id,
            "component": str(self.plan.component),
            "target": self.plan.target,
            "status": str(self.status),
            "reason": self.reason,
            "failed": self.failed,
            "held": self.held,
            "counts": self.counts(),
            "created": self.created,
            "updated": self.updated,
            "policy": self.policy.to_json(),
            "plan": self.plan.to_json(),
            "nodes": {n: s.to_json() for n, s in self.nodes.items()},
            "audit_seq": self.audit_seq,
            "outbox": self.outbox,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutState:
        try:
            if data.get("schema") != SCHEMA:
                raise RolloutError(f"unsupported state schema {data.get('schema')!r}")
            plan = Plan.from_json(data["plan"])
            nodes = {str(n): NodeState.from_json(str(n), s) for n, s in data["nodes"].items()}
            if list(nodes) != [e.node for e in plan.nodes]:
                raise RolloutError("the nodes do not match the plan's")
            return cls(
                rollout_id=str(data["rollout"]),
                plan=plan,
                policy=Policy.from_json(data["policy"]),
                status=Status(data["status"]),
                nodes=nodes,
                reason=str(data.get("reason", "")),
                created=str(data.get("created", "")),
                updated=str(data.get("updated", "")),
                audit_seq=int(data.get("audit_seq", 0)),
                outbox=[dict(line) for line in data.get("outbox", [])],
            )
        except RolloutError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RolloutError(
                f"not a gpuctl rollout state ({type(exc).__name__}: {exc})"
            ) from None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One line of audit.jsonl before the store adds ``ts`` and ``rollout``.

    ``node`` is None for events about the whole rollout. ``details`` holds JSON values only;
    nothing secret is ever passed in (the backend gives none to the executor).
    """

    event: str
    node: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
