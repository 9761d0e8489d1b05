"""A fake cluster for the rollout tests: Slurm and nodes in memory, a failure script per node.

:class:`FakeBackend` implements :class:`gpuctl.rollout.backend.Backend`. It is "reality": it
outlives the executors that drive it, so a test can kill one executor (:class:`Killed`, raised
at the N-th backend call, before or after the call's effect) and continue with a fresh one.
Every write of a :class:`KillableStore` is a kill point too (counted with the calls). Once
killed, every backend call and every store write raises Killed, as if the process had died at
that instant.

Time: ``now``/``sleep`` use a fake clock per thread (each node's pipeline runs in its own
thread, so one node's waits never eat another node's timeout). No real sleeping.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuctl.rollout.backend import (
    BackendError,
    ValidationOutcome,
    Versions,
    settled_slurm_node,
)
from gpuctl.rollout.executor import Executor
from gpuctl.rollout.model import (
    RESTART_KIND,
    Component,
    Plan,
    Policy,
    Restart,
    RolloutState,
    Status,
)
from gpuctl.rollout.plan import plan_rollout
from gpuctl.rollout.store import RolloutStore
from gpuctl.slurm import SlurmNode

OLD = "1.0"
TARGET = "2.0"
FOREIGN_REASON = "hw ticket 4711"
VALIDATION_FAILURE = "nccl all_reduce busbw 120 GB/s < 350 GB/s"


class Killed(BaseException):
    """The simulated ``kill -9``: not an Exception, so no ``except Exception`` catches it."""


@dataclass
class Script:
    """How one node misbehaves."""

    jobs_polls: int = 0  # jobs_on answers 1 this many times, then 0
    drain_timeout: bool = False  # its jobs never end
    apply_error: bool = False  # apply fails (nothing flashed)
    no_come_back: bool = False  # after a restart the node stays down
    validation_fail: bool = False
    versions_unreadable: bool = False  # versions() always fails
    wrong_version: bool = False  # the restart discards the pending version
    pending_hidden: bool = False  # versions() cannot show a staged version (Redfish, HGX GPUs)
    # after a restart Slurm shows the node NOT_RESPONDING for this many slurm_node calls
    # (slurmd registers late), or for ever
    slurmd_late: int = 0
    slurmd_never: bool = False
    slurmd_lost_on_resume: bool = False  # registered after the restart, gone after the resume


@dataclass
class FakeNode:
    name: str
    running: dict[Component, str | None]
    pending: dict[Component, str | None]
    script: Script = field(default_factory=Script)
    drained: bool = False
    reason: str | None = None
    down: bool = False
    jobs_left: int = 0
    applies: int = 0  # apply calls that flashed something
    restarts: int = 0
    unregistered: int = 0  # slurm_node calls left showing NOT_RESPONDING; -1: for ever
    resumed_unregistered: int = 0  # resume calls while Slurm showed it NOT_RESPONDING


def _activates(kind: Restart, needed: Restart) -> bool:
    if needed is Restart.NONE:
        return True
    if needed is Restart.REBOOT:
        return kind in (Restart.REBOOT, Restart.POWER_CYCLE)
    return kind is Restart.POWER_CYCLE


class FakeBackend:
    """Slurm plus nodes. Calls are serialised, counted and logged in ``calls``."""

    def __init__(self, nodes: Iterable[FakeNode]) -> None:
        self.nodes: dict[str, FakeNode] = {n.name: n for n in nodes}
        self.calls: list[tuple[str, str]] = []
        self.count = 0
        self.kill_at: int | None = None
        self.kill_after_effect = False
        self.dead = False
        # called (under the fake's lock) before a call's effect: (fake, method, node)
        self.hook: Callable[[FakeBackend, str, str], None] | None = None
        self.max_gpuctl_drained = 0
        self._lock = threading.RLock()
        self._clock = threading.local()

    # --- test controls -----------------------------------------------------------------------

    def arm(self, kill_at: int | None, *, after_effect: bool = False) -> None:
        """Die at the ``kill_at``-th call counted from now (1-based)."""
        self.kill_at = None if kill_at is None else self.count + kill_at
        self.kill_after_effect = after_effect

    def revive(self) -> None:
        self.dead = False
        self.kill_at = None

    def reset_counters(self) -> None:
        self.calls.clear()
        self.count = 0

    def calls_of(self, method: str) -> list[str]:
        return [node for m, node in self.calls if m == method]

    def flags(self, name: str) -> frozenset[str]:
        n = self.nodes[name]
        flags = {"MIXED" if (n.jobs_left > 0 or n.script.drain_timeout) else "IDLE"}
        if n.drained:
            flags.add("DRAIN")
        if n.down:
            flags.add("DOWN")
        if n.unregistered:
            flags.add("NOT_RESPONDING")
        return frozenset(flags)

    def settled_flags(self, name: str) -> frozenset[str]:
        """``flags`` without a passing NOT_RESPONDING (a resume's): no end state, as how many
        reads were left of it depends on where a run was killed."""
        passing = {"NOT_RESPONDING"} if self.nodes[name].unregistered > 0 else set()
        return self.flags(name) - passing

    def snapshot(self) -> dict[str, tuple[Any, ...]]:
        """What an operator sees afterwards: Slurm state and reason, versions, per node."""
        return {
            name: (
                tuple(sorted(self.settled_flags(name))),
                n.reason,
                tuple(sorted((str(c), v) for c, v in n.running.items())),
                tuple(sorted((str(c), v) for c, v in n.pending.items())),
            )
            for name, n in self.nodes.items()
        }

    def applies(self) -> Counter[str]:
        return Counter({name: n.applies for name, n in self.nodes.items()})

    # --- the call gate -----------------------------------------------------------------------

    def _enter(self, method: str, node: str) -> FakeNode:
        if self.dead:
            raise Killed
        self.count += 1
        self.calls.append((method, node))
        if self.count == self.kill_at and not self.kill_after_effect:
            self.dead = True
            raise Killed
        if self.hook is not None:
            self.hook(self, method, node)
        if node not in self.nodes:
            raise BackendError(f"{node}: no such node")
        return self.nodes[node]

    def _leave(self) -> None:
        if self.count == self.kill_at and self.kill_after_effect and not self.dead:
            self.dead = True
            raise Killed

    @contextmanager
    def write_point(self) -> Iterator[None]:
        """A store write as a kill point: counted like a call (not logged in ``calls``), so a
        kill can fall between two writes with no backend call between them."""
        with self._lock:
            if self.dead:
                raise Killed
            self.count += 1
            if self.count == self.kill_at and not self.kill_after_effect:
                self.dead = True
                raise Killed
            try:
                yield
            finally:
                self._leave()

    def _reachable(self, n: FakeNode) -> None:
        if n.down:
            raise BackendError(f"{n.name}: ssh: connect to host {n.name} port 22: No route to host")

    # --- Backend -----------------------------------------------------------------------------

    def slurm_node(self, node: str) -> SlurmNode:
        with self._lock:
            n = self._enter("slurm_node", node)
            try:
                seen = SlurmNode(self.flags(node), n.reason)
                if n.unregistered > 0:
                    n.unregistered -= 1
                return seen
            finally:
                self._leave()

    def drain(self, node: str, reason: str) -> None:
        with self._lock:
            n = self._enter("drain", node)
            try:
                n.drained, n.reason = True, reason
                held = sum(
                    1
                    for m in self.nodes.values()
                    if m.drained and (m.reason or "").startswith("gpuctl rollout:")
                )
                self.max_gpuctl_drained = max(self.max_gpuctl_drained, held)
            finally:
                self._leave()

    def resume(self, node: str) -> None:
        with self._lock:
            n = self._enter("resume", node)
            try:
                if n.unregistered:
                    n.resumed_unregistered += 1
                n.drained, n.reason = False, None
                # as Slurm 22.05 does: NOT_RESPONDING until the node answers the registration
                # request the resume sends (one poll here; slurmd_never: for ever)
                lost = n.unregistered == -1 or n.script.slurmd_lost_on_resume
                n.unregistered = -1 if lost else 1
            finally:
                self._leave()

    def jobs_on(self, node: str) -> int:
        with self._lock:
            n = self._enter("jobs_on", node)
            try:
                if n.script.drain_timeout:
                    return 2
                if n.jobs_left > 0:
                    n.jobs_left -= 1
                    return 1
                return 0
            finally:
                self._leave()

    def versions(self, node: str, component: Component) -> Versions:
        with self._lock:
            n = self._enter("versions", node)
            try:
                self._reachable(n)
                if n.script.versions_unreadable:
                    raise BackendError(
                        f"{node}: cannot read the {component} version: exit status 2"
                    )
                if n.script.pending_hidden:
                    return Versions(n.running.get(component), None, pending_known=False)
                return Versions(n.running.get(component), n.pending.get(component))
            finally:
                self._leave()

    def apply(self, node: str, component: Component, version: str) -> None:
        with self._lock:
            n = self._enter("apply", node)
            try:
                self._reachable(n)
                if n.script.apply_error:
                    raise BackendError(f"{node}: flashing {component} {version}: exit status 1")
                n.applies += 1
                if RESTART_KIND[component] is Restart.NONE:
                    n.running[component], n.pending[component] = version, None
                else:
                    n.pending[component] = version
            finally:
                self._leave()

    def restart(self, node: str, kind: Restart) -> None:
        with self._lock:
            n = self._enter("restart", node)
            try:
                self._reachable(n)
                n.restarts += 1
                if n.script.no_come_back:
                    n.down = True
                    return
                n.unregistered = -1 if n.script.slurmd_never else n.script.slurmd_late
                for component, pending in n.pending.items():
                    if pending is None or not _activates(kind, RESTART_KIND[component]):
                        continue
                    if not n.script.wrong_version:
                        n.running[component] = pending
                    n.pending[component] = None
            finally:
                self._leave()

    def wait_up(self, node: str, timeout_s: float) -> bool:
        with self._lock:
            n = self._enter("wait_up", node)
            try:
                return not n.down
            finally:
                self._leave()

    def validate(self, node: str, level: str) -> ValidationOutcome:
        with self._lock:
            n = self._enter("validate", node)
            try:
                self._reachable(n)
                if n.script.validation_fail:
                    return ValidationOutcome(False, VALIDATION_FAILURE)
                return ValidationOutcome(True, f"{level}: all checks passed")
            finally:
                self._leave()

    def now(self) -> float:
        if self.dead:
            raise Killed
        t: float = getattr(self._clock, "t", 0.0)
        return t

    def sleep(self, seconds: float) -> None:
        if self.dead:
            raise Killed
        self._clock.t = getattr(self._clock, "t", 0.0) + seconds


class KillableStore(RolloutStore):
    """A RolloutStore whose every write is a kill point, and that writes nothing once the fake
    backend is dead."""

    def __init__(self, directory: Path, fake: FakeBackend, *, durable: bool = True) -> None:
        super().__init__(directory, durable=durable)
        self.fake = fake

    def save(self, state: RolloutState) -> None:
        with self.fake.write_point():
            super().save(state)

    def append_line(self, line: dict[str, Any]) -> None:
        with self.fake.write_point():
            super().append_line(line)


# --- building clusters and running rollouts ----------------------------------------------------


def make_fake(
    names: Sequence[str],
    *,
    component: Component = Component.DRIVER,
    scripts: Mapping[str, Script] | None = None,
    foreign: Iterable[str] = (),
    down: Iterable[str] = (),
    at_target: Iterable[str] = (),
) -> FakeBackend:
    """Nodes running OLD of every component; ``at_target`` nodes run TARGET of ``component``."""
    scripts = scripts or {}
    foreign, down, at_target = set(foreign), set(down), set(at_target)
    nodes = []
    for name in names:
        script = scripts.get(name, Script())
        running: dict[Component, str | None] = dict.fromkeys(Component, OLD)
        if name in at_target:
            running[component] = TARGET
        node = FakeNode(name, running, dict.fromkeys(Component), script)
        node.jobs_left = script.jobs_polls
        if name in foreign:
            node.drained, node.reason = True, FOREIGN_REASON
        if name in down:
            node.down, node.reason = True, "Not responding"
        nodes.append(node)
    return FakeBackend(nodes)


def plan_for(
    fake: FakeBackend,
    policy: Policy,
    *,
    component: Component = Component.DRIVER,
    target: str = TARGET,
) -> Plan:
    """Read the cluster as the CLI would, plan, and reset the fake's call counters."""
    slurm = {name: settled_slurm_node(fake, name) for name in fake.nodes}
    versions: dict[str, Versions | BackendError] = {}
    for name in fake.nodes:
        try:
            versions[name] = fake.versions(name, component)
        except BackendError as exc:
            versions[name] = exc
    plan = plan_rollout(list(fake.nodes), slurm, versions, component, target, policy)
    fake.reset_counters()
    return plan


def start(fake: FakeBackend, directory: Path, plan: Plan, *, durable: bool = True) -> KillableStore:
    store = KillableStore(directory, fake, durable=durable)
    store.create(plan)
    return store


def continue_rollout(fake: FakeBackend, directory: Path, *, durable: bool = True) -> RolloutState:
    """A new process: fresh store and executor objects, the state read from disk."""
    store = KillableStore(directory, fake, durable=durable)
    return Executor(fake, store).run()


def run_with_kills(
    fake: FakeBackend,
    directory: Path,
    plan: Plan,
    kills: Sequence[tuple[int, bool]],
    *,
    durable: bool = True,
) -> tuple[RolloutState, int]:
    """Run ``plan``, killed at each ``(point, after effect)`` in turn and continued from disk
    (as ``gpuctl rollout resume`` would, after a kill -9: the state says ``running``); the final
    state and how many kills happened."""
    store = start(fake, directory, plan, durable=durable)
    killed = 0
    pending = list(kills)
    executor: Executor | None = Executor(fake, store)
    while True:
        if pending:
            at, after = pending.pop(0)
            fake.arm(at, after_effect=after)
        else:
            fake.arm(None)
        try:
            if executor is None:
                return continue_rollout(fake, directory, durable=durable), killed
            return executor.run(), killed
        except Killed:
            killed += 1
            fake.revive()
            executor = None
            # a kill after the final state was saved: that run had ended (continuing a halted
            # rollout would be an operator's decision); only its last audit line may be missing
            on_disk = KillableStore(directory, fake, durable=durable)
            state = on_disk.load()
            if state.status in (Status.HALTED, Status.ABORTED, Status.DONE):
                on_disk.complete_audit(state)
                return state, killed


def outcome(state: RolloutState) -> dict[str, Any]:
    """The end state of a rollout that a resume must reproduce."""
    return {
        "status": str(state.status),
        "reason": state.reason,
        "nodes": {
            n: (str(s.phase), s.reason, s.drained, s.halts, s.failed_phase)
            for n, s in state.nodes.items()
        },
    }


def event_sequence(audit: Sequence[Mapping[str, Any]], node: str | None) -> list[str]:
    return [str(line["event"]) for line in audit if line["node"] == node]


@dataclass
class AuditReplay:
    """What the audit log says happened, replayed line by line."""

    violations: list[str] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # drained by gpuctl, not resumed nor released
    peak: int = 0
    applied: Counter[str] = field(default_factory=Counter)


def replay_audit(
    audit: Sequence[Mapping[str, Any]], max_unavailable: int, untouchable: Iterable[str]
) -> AuditReplay:
    """Check the audit log alone: max_unavailable at every line, no drain or resume of a node
    that someone else had, no update applied twice."""
    out = AuditReplay()
    untouchable = set(untouchable)
    for i, line in enumerate(audit, 1):
        event, node = line["event"], line["node"]
        if event in ("draining", "drained", "resumed") and node in untouchable:
            out.violations.append(f"line {i}: {event} {node}, which someone else had")
        if event in ("draining", "drained"):
            out.held.add(node)
        elif event in ("resumed", "released"):
            out.held.discard(node)
        elif event == "applied":
            out.applied[node] += 1
            if out.applied[node] > 1:
                out.violations.append(f"line {i}: {node} applied a second time")
        out.peak = max(out.peak, len(out.held))
        if len(out.held) > max_unavailable:
            out.violations.append(
                f"line {i}: {len(out.held)} nodes out of service > {max_unavailable}: "
                + ", ".join(sorted(out.held))
            )
    return out
