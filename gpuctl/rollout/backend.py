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
from gpuctl.slurm import SlurmNode

# Slurm shows a node NOT_RESPONDING for a moment right after ``scontrol update state=resume``
# (it asks the node to register again; measured on Slurm 22.05 in the lab: IDLE+NOT_RESPONDING
# for under a second) and after its slurmd restarted. A node whose only sign of trouble is that
# flag (:attr:`gpuctl.slurm.SlurmNode.only_not_responding`) is read again for this long (the
# default MessageTimeout is 10 s) before it counts as down.
NOT_RESPONDING_GRACE_S = 20.0
NOT_RESPONDING_POLL_S = 1.0


class BackendError(GpuctlError):
    """A backend could not read or change something; the message says what and where."""


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
