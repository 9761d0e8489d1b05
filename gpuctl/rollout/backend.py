"""What the rollout executor needs from a cluster, as a Protocol, and the values it exchanges.

The real implementation (SSH, ``scontrol``, vendor firmware tools) lives elsewhere; the unit
tests use a fake that models Slurm and the nodes. Every method may raise :class:`BackendError`
for "could not tell" or "could not do"; the executor turns that into a failed node (fail
closed), never into a guess. Nothing a backend returns carries credentials.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuctl.errors import GpuctlError
from gpuctl.rollout.model import Component, Restart

DRAIN_FLAGS: frozenset[str] = frozenset({"DRAIN", "DRAINED", "DRAINING"})
# slurmctld cannot reach the node's slurmd: ``NOT_RESPONDING`` in ``scontrol show node``'s
# State, ``*`` after the state in its short form (``IDLE*``, sinfo's ``idle*``)
NOT_RESPONDING_FLAGS: frozenset[str] = frozenset({"NOT_RESPONDING", "NO_RESPOND", "*"})
DOWN_FLAGS: frozenset[str] = (
    frozenset({"DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"}) | NOT_RESPONDING_FLAGS
)
# Slurm shows a node NOT_RESPONDING for a moment right after ``scontrol update state=resume``
# (it asks the node to register again; measured on Slurm 22.05 in the lab: IDLE+NOT_RESPONDING
# for under a second) and after its slurmd restarted. A node whose only sign of trouble is that
# flag is read again for this long (the default MessageTimeout is 10 s) before it counts as down.
NOT_RESPONDING_GRACE_S = 20.0
NOT_RESPONDING_POLL_S = 1.0
# other states where someone else has the node: gpuctl leaves it alone
OTHER_HOLD_FLAGS: frozenset[str] = frozenset(
    {"FAIL", "FAILING", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERING_UP"}
)


class BackendError(GpuctlError):
    """A backend could not read or change something; the message says what and where."""


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """A node as Slurm shows it: its state flags, upper case (``IDLE``, ``MIXED``, ``DRAIN``,
    ``DOWN``, ...), and the reason set with the last drain or down (None when there is none)."""

    flags: frozenset[str]
    reason: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "flags", frozenset(f.strip().upper() for f in self.flags))

    @property
    def is_drained(self) -> bool:
        """Drained or draining (no new jobs start on it)."""
        return bool(self.flags & DRAIN_FLAGS)

    @property
    def is_down(self) -> bool:
        return bool(self.flags & DOWN_FLAGS)

    @property
    def state(self) -> str:
        """The flags as ``scontrol`` joins them (sorted): ``DRAIN+IDLE+NOT_RESPONDING``."""
        return "+".join(sorted(self.flags)) or "no state"

    @property
    def responding(self) -> bool:
        """slurmctld reaches the node's slurmd (after a reboot: slurmd has registered again)."""
        return not self.flags & NOT_RESPONDING_FLAGS

    @property
    def only_not_responding(self) -> bool:
        """Not responding, and nothing else about it would keep gpuctl off it (see
        ``NOT_RESPONDING_GRACE_S``)."""
        rest = SlurmNode(self.flags - NOT_RESPONDING_FLAGS, self.reason)
        return not self.responding and rest.hold_reason() is None

    def drained_with(self, reason: str) -> bool:
        """Drained, with exactly this reason (gpuctl's test for "still mine")."""
        return self.is_drained and self.reason == reason

    def hold_reason(self) -> str | None:
        """Why gpuctl must leave this node alone (someone else has it), or None.

        Checked before gpuctl drains a node: drained (by anyone: a node gpuctl did not drain in
        this rollout is someone else's), down, or in another administrative state.
        """
        state = self.state
        why = f": {self.reason}" if self.reason else ""
        if self.is_drained:
            return f"drained by someone else{why or ' (no reason given)'}"
        if self.is_down:
            return f"down ({state}){why}"
        if self.flags & OTHER_HOLD_FLAGS:
            return f"not in service ({state}){why}"
        return None


@dataclass(frozen=True, slots=True)
class Versions:
    """One component's versions on one node.

    ``running``: the active version (None: could not be determined; gpuctl then never treats the
    node as at target). ``pending``: installed or flashed but not active yet (None: nothing).
    ``pending_known``: False where the tool cannot show a staged version (Redfish for HGX GPU
    firmware): ``pending`` None then means "cannot tell", not "nothing".
    """

    running: str | None
    pending: str | None = None
    pending_known: bool = True


@dataclass(frozen=True, slots=True)
class ValidationOutcome:
    passed: bool
    reason: str = ""


class Backend(Protocol):
    """Side effects and observations of a rollout. All methods may raise BackendError."""

    def slurm_node(self, node: str) -> SlurmNode: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def jobs_on(self, node: str) -> int:
        """Running jobs on the node."""
        ...

    def versions(self, node: str, component: Component) -> Versions: ...

    def apply(self, node: str, component: Component, version: str) -> None:
        """Flash or install ``version``; afterwards ``versions().pending == version`` (or, for
        a component that needs no restart, ``running == version`` once it has reset)."""
        ...

    def restart(self, node: str, kind: Restart) -> None:
        """Issue a reboot or power cycle and return once it is issued."""
        ...

    def wait_up(self, node: str, timeout_s: float) -> bool:
        """True once the node is back and reachable; False after ``timeout_s``."""
        ...

    def validate(self, node: str, level: str) -> ValidationOutcome: ...

    def now(self) -> float:
        """A monotonic clock in seconds (``time.monotonic`` for a real cluster)."""
        ...

    def sleep(self, seconds: float) -> None: ...


def poll_slurm_node(
    backend: Backend,
    node: str,
    done: Callable[[SlurmNode], bool],
    timeout_s: float,
    interval_s: float,
) -> tuple[SlurmNode, bool]:
    """Read Slurm's view of ``node`` every ``interval_s`` until ``done`` holds, at most
    ``timeout_s``: (the last reading, whether ``done`` held)."""
    start = backend.now()
    while True:
        slurm = backend.slurm_node(node)
        if done(slurm):
            return slurm, True
        if backend.now() - start >= timeout_s:
            return slurm, False
        backend.sleep(interval_s)


def settled_slurm_node(backend: Backend, node: str) -> SlurmNode:
    """``backend.slurm_node(node)``, read again while the node's only trouble is NOT_RESPONDING,
    at most ``NOT_RESPONDING_GRACE_S``; the last reading then stands (the node counts as down)."""
    slurm, _ = poll_slurm_node(
        backend,
        node,
        lambda s: not s.only_not_responding,
        NOT_RESPONDING_GRACE_S,
        NOT_RESPONDING_POLL_S,
    )
    return slurm
