"""The rollout executor: batches in order, a per-node pipeline, every step written ahead.

Per node (``Phase`` names in brackets; each is written to state.json, with an audit line,
*before* its side effect, and its result after it):

0. check (coordinator, read-only): Slurm state first (someone else has the node: ``left``; a
   node that is only NOT_RESPONDING is read again first, ``settled_slurm_node``), then
   the versions (running the target: ``skipped``; unreadable or unknown: ``failed``). Slurm comes
   first because a down node's version usually cannot be read: it is left, not failed.
1. [draining] take a max_unavailable slot and drain with the reason
   ``gpuctl rollout: <component> <target>``.
2. [waiting-jobs] poll ``jobs_on`` until 0, at most ``drain_timeout_s``. On timeout gpuctl
   resumes the node (it changed nothing) and the node fails "jobs still running after N s".
3. [applying] read the versions; apply only when neither running nor pending is the target.
4. [restarting] reboot or power cycle (components that need none go straight to verifying).
5. [waiting-up] ``wait_up`` at most ``reboot_timeout_s``. A node that does not come back fails
   and halts the rollout whatever the failure threshold.
6. [verifying] the running version must be the target. Components that need no restart (the
   BMC resets itself) are polled until it is, at most ``reboot_timeout_s``.
7. [validating] ``validate`` at ``policy.validate_level``; a failed validation leaves the node
   drained with gpuctl's reason and fails it.
8. [resuming] resume only if the node is still drained with gpuctl's reason, and only once
   Slurm shows its slurmd responding (after a reboot slurmd must register again; until then the
   node shows ``NOT_RESPONDING``, at most ``reboot_timeout_s``, else it fails, left drained),
   then again until the resume's own registration request is answered (else it fails, resumed).
   An operator who re-drained it with another reason keeps it: the node is ``done`` with the
   reason "left drained: reason changed by someone else (...)" and gpuctl gives up its slot.

Any :class:`BackendError` fails the node in the phase it happened in; a node gpuctl drained
stays drained (``NodeState.drained``), is never resumed after a failed update, and keeps its
max_unavailable slot.

Scheduling. Batches run in order. Within a batch the coordinator checks pending nodes in order
and starts a *wave*: as many as the free max_unavailable slots allow (slots held by failed nodes
left drained count), claimed together in one write of state.json, one thread each. A wave runs
to its end before the next starts, so halting decisions depend only on per-node outcomes, never
on thread timing, and a resumed rollout makes the same decisions as an uninterrupted one. Before
each node is started the coordinator checks, in this order:

* halt: a failed node that halts (did not come back), or ``failed >= failure_threshold``;
* abort: ``store.request_abort()`` was called;
* budget: no free slot and nothing in flight means failed nodes hold every slot; the rollout
  halts with that reason instead of waiting for ever. Before halting, failed nodes are checked
  again: one that is no longer drained with gpuctl's reason (an operator fixed and resumed it)
  gives its slot back.

Nodes already in flight always finish their pipeline.

Statuses: ``halted`` when a halt condition holds at the end (even when no node was left to
start) or the budget ran out; ``aborted`` when an abort left nodes unstarted; ``done``
otherwise, with failures below the threshold listed in ``RolloutState.failed``.

Continuing a stopped rollout. ``run()`` on a ``halted`` or ``aborted`` state is an operator's
decision to go on: nodes that did not come back are acknowledged (``halts`` cleared, audit
``halt-acknowledged``) and from then on count like any other failure: toward the threshold, and
holding their slot while they stay drained with gpuctl's reason. A state that says ``running``
was left by a killed process, and nothing is acknowledged: the rollout continues exactly as the
killed run would have.

Resume. ``run()`` on a state loaded from disk first reconciles the nodes that were in flight
(they form the first wave) with what the cluster shows, instead of repeating blindly: a node in
``draining`` already drained with gpuctl's reason goes on, one drained by someone else is left;
``restarting`` restarts again only when the target is pending and not running, or when the
staged version cannot be seen and the target is not running (a node that does not answer is
waited for); every other phase re-reads before acting (``applying`` applies only
when neither version is the target; ``resuming`` resumes only a node still drained with gpuctl's
reason), so no update is applied twice. A wait that was interrupted starts its timeout afresh:
monotonic clocks do not survive a restart.

The caller holds :func:`gpuctl.rollout.store.cluster_lock` while ``run()`` runs. The executor
never prints; it returns the final :class:`RolloutState` (also in state.json).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from gpuctl.rollout.backend import (
    Backend,
    BackendError,
    poll_slurm_node,
    settled_slurm_node,
)
from gpuctl.rollout.model import (
    IN_FLIGHT,
    RESTART_KIND,
    AuditEvent,
    NodeState,
    Phase,
    Policy,
    PolicyError,
    Restart,
    RolloutState,
    Status,
    drain_reason,
    seconds,
)
from gpuctl.rollout.store import RolloutStore
from gpuctl.slurm import Owner, SlurmNode

Step = Callable[["Executor", str, bool], None]


class Executor:
    """Runs (or continues) one rollout; see the module docstring for the rules.

    ``state`` defaults to the store's state.json. ``policy``, when given and different from the
    one recorded, replaces it (thresholds, timeouts, validation level and poll interval may
    change on resume); the batching fields must stay as planned, else :class:`PolicyError`.
    """

    def __init__(
        self,
        backend: Backend,
        store: RolloutStore,
        state: RolloutState | None = None,
        policy: Policy | None = None,
    ) -> None:
        self._backend = backend
        self._store = store
        self._state = state if state is not None else store.load()
        if policy is not None and not policy.same_batches(self._state.plan.policy):
            raise PolicyError(
                "canary, batch_size and max_unavailable are fixed when a rollout is planned; "
                "plan a new rollout to change them"
            )
        self._new_policy = policy if policy is not None and policy != self._state.policy else None
        plan = self._state.plan
        self._target = plan.target
        self._component = plan.component
        self._reason = drain_reason(plan.component, plan.target)
        self._owner = Owner(self._reason, exact=True)  # resume only what this rollout drained
        self._kind = RESTART_KIND[plan.component]
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    @property
    def state(self) -> RolloutState:
        return self._state

    @property
    def _policy(self) -> Policy:
        return self._state.policy

    # --- the coordinator ---------------------------------------------------------------------

    def run(self) -> RolloutState:
        """Run the rollout to its end (done, halted or aborted) and return its state.

        Exceptions other than BackendError (bugs) propagate once the nodes in flight have
        finished; state.json then still says ``running`` and a later ``run()`` continues. A
        KeyboardInterrupt reaches the caller at once, and the wave's threads (not daemons)
        finish their nodes before the process exits. To stop gracefully, request an abort.
        """
        st = self._state
        self._store.complete_audit(st)
        if st.status is Status.DONE:
            return st
        events = [
            AuditEvent(
                "started", details={"resumed": st.status is not Status.PLANNED, "pid": os.getpid()}
            )
        ]
        if self._new_policy is not None:
            events.append(
                AuditEvent("policy-changed", details={"policy": self._new_policy.to_json()})
            )
            st.policy = self._new_policy
            self._new_policy = None
        if st.status in (Status.HALTED, Status.ABORTED):
            # an operator continues a rollout that stopped: its halting failures are acknowledged
            acknowledged = [n for n, s in st.nodes.items() if s.phase is Phase.FAILED and s.halts]
            for node in acknowledged:
                st.nodes[node] = replace(st.nodes[node], halts=False)
            if acknowledged:
                events.append(AuditEvent("halt-acknowledged", details={"nodes": acknowledged}))
        st.status, st.reason = Status.RUNNING, ""
        self._store.record(st, *events)

        self._refresh_failed_holds()
        in_flight = st.in_flight
        if in_flight:
            self._run_wave(in_flight, resumed=True)
        budget_halt: str | None = None
        for batch in st.plan.batches:
            budget_halt = self._run_batch(batch)
            if budget_halt is not None or self._stop() is not None:
                break
        return self._finish(budget_halt)

    def _run_batch(self, batch: Iterable[str]) -> str | None:
        """Start waves until the batch has no pending node; a budget halt reason, or None."""
        names = list(batch)
        while True:
            if self._stop() is not None:
                return None
            pending = [n for n in names if self._state.nodes[n].phase is Phase.PENDING]
            if not pending:
                return None
            wave = self._next_wave(pending)
            if wave:
                self._run_wave(wave, resumed=False)
                continue
            if self._stop() is not None or not any(
                self._state.nodes[n].phase is Phase.PENDING for n in names
            ):
                continue
            # nodes are waiting, nothing is in flight and no slot is free: failed nodes hold them
            self._refresh_failed_holds()
            if self._free_slots() <= 0:
                held = ", ".join(self._state.held)
                return (
                    f"max_unavailable ({self._state.plan.max_unavailable}) is used up by failed "
                    f"nodes left drained: {held}"
                )

    def _free_slots(self) -> int:
        return self._state.plan.max_unavailable - len(self._state.held)

    def _halt_reason(self) -> str | None:
        st = self._state
        fatal = [s.reason for s in st.nodes.values() if s.phase is Phase.FAILED and s.halts]
        if fatal:
            return "; ".join(fatal)
        failed = st.failed
        threshold = self._policy.failure_threshold
        if len(failed) >= threshold:
            return f"{len(failed)} node(s) failed, failure_threshold is {threshold}: " + ", ".join(
                failed
            )
        return None

    def _stop(self) -> str | None:
        """Why no new node may start (halt or abort), or None."""
        halt = self._halt_reason()
        if halt is not None:
            return halt
        if self._store.abort_requested():
            return "abort requested"
        return None

    def _next_wave(self, pending: list[str]) -> list[str]:
        """Check pending nodes in order and claim as many as the free slots allow."""
        free = self._free_slots()
        wave: list[str] = []
        for node in pending:
            if len(wave) >= free or self._stop() is not None:
                break
            if self._check(node):
                wave.append(node)
        if not wave or self._stop() is not None:
            return []
        with self._lock:
            events = []
            for node in wave:
                self._state.nodes[node] = replace(
                    self._state.nodes[node], phase=Phase.DRAINING, drained=True
                )
                events.append(
                    AuditEvent(
                        "draining",
                        node,
                        {"reason": self._reason, "batch": self._state.nodes[node].batch},
                    )
                )
            self._store.record(self._state, *events)
        return wave

    def _check(self, node: str) -> bool:
        """Step 0: whether ``node`` is to be updated now; records skipped/left/failed."""
        b = self._backend
        try:
            slurm = settled_slurm_node(b, node)
            hold = slurm.hold_reason()
            if hold is not None:
                self._end(node, Phase.LEFT, hold)
                return False
            versions = b.versions(node, self._component)
        except BackendError as exc:
            self._fail(node, Phase.CHECKING, str(exc))
            return False
        if versions.running is None:
            self._fail(node, Phase.CHECKING, "running version unknown")
            return False
        if versions.running == self._target:
            self._end(node, Phase.SKIPPED, f"already at {self._target}")
            return False
        return True

    def _run_wave(self, nodes: list[str], *, resumed: bool) -> None:
        threads = [
            threading.Thread(target=self._node_main, args=(node, resumed), name=f"rollout-{node}")
            for node in nodes
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._errors:
            error = self._errors[0]
            self._errors.clear()
            raise error

    def _refresh_failed_holds(self) -> None:
        """Give back the slots of failed nodes that are no longer drained with gpuctl's reason."""
        for node in self._state.held:
            current = self._state.nodes[node]
            if current.phase is not Phase.FAILED:
                continue
            try:
                slurm = self._backend.slurm_node(node)
            except BackendError:
                continue
            if not slurm.drained_by(self._owner):
                self._set(node, {"drained": False}, _released(node, slurm)[1])

    def _finish(self, budget_halt: str | None) -> RolloutState:
        st = self._state
        halt = self._halt_reason()
        if halt is not None:
            st.status, st.reason = Status.HALTED, halt
        elif budget_halt is not None:
            st.status, st.reason = Status.HALTED, budget_halt
        elif st.pending and self._store.abort_requested():
            st.status, st.reason = Status.ABORTED, "abort requested"
        elif st.pending:  # pragma: no cover - an abort withdrawn while the loop stopped for it
            st.status, st.reason = Status.HALTED, "stopped with nodes unstarted"
        else:
            st.status, st.reason = Status.DONE, ""
        event = {Status.DONE: "finished", Status.HALTED: "halted", Status.ABORTED: "aborted"}
        self._store.record(
            st,
            AuditEvent(
                event[st.status],
                details={
                    "status": str(st.status),
                    "reason": st.reason,
                    "failed": st.failed,
                    "held": st.held,
                    "counts": st.counts(),
                },
            ),
        )
        return st

    # --- state changes (serialised: one thread at a time writes) -----------------------------

    def _node(self, node: str) -> NodeState:
        return self._state.nodes[node]

    def _set(self, node: str, changes: dict[str, Any], *events: AuditEvent) -> None:
        with self._lock:
            self._state.nodes[node] = replace(self._state.nodes[node], **changes)
            self._store.record(self._state, *events)

    def _advance(self, node: str, phase: Phase, *events: AuditEvent) -> None:
        """Record the result events of a step and the intent of the next phase, in one write."""
        self._set(node, {"phase": phase}, *events, AuditEvent(str(phase), node))

    def _end(
        self, node: str, phase: Phase, reason: str, *events: AuditEvent, **changes: Any
    ) -> None:
        self._set(
            node,
            {"phase": phase, "reason": reason, **changes},
            *events,
            AuditEvent(str(phase), node, {"reason": reason}),
        )

    def _fail(
        self,
        node: str,
        phase: Phase,
        reason: str,
        *events: AuditEvent,
        halts: bool = False,
        drained: bool | None = None,
    ) -> None:
        current = self._node(node)
        held = current.drained if drained is None else drained
        self._set(
            node,
            {
                "phase": Phase.FAILED,
                "failed_phase": phase,
                "reason": reason,
                "halts": halts,
                "drained": held,
            },
            *events,
            AuditEvent(
                "failed",
                node,
                {"phase": str(phase), "reason": reason, "drained": held, "halts": halts},
            ),
        )

    # --- the per-node pipeline ---------------------------------------------------------------

    def _node_main(self, node: str, resumed: bool) -> None:
        try:
            self._pipeline(node, resumed)
        except BaseException as exc:  # re-raised by the coordinator once the wave has ended
            with self._lock:
                self._errors.append(exc)

    def _pipeline(self, node: str, resumed: bool) -> None:
        reconcile = resumed
        if reconcile:
            self._set(
                node, {}, AuditEvent("reconciling", node, {"phase": str(self._node(node).phase)})
            )
        while True:
            phase = self._node(node).phase
            if phase not in IN_FLIGHT:  # terminal (or pending: not this wave's)
                return
            try:
                _STEPS[phase](self, node, reconcile)
            except BackendError as exc:
                self._fail(node, phase, str(exc))
                return
            reconcile = False

    def _step_draining(self, node: str, reconcile: bool) -> None:
        slurm = settled_slurm_node(self._backend, node)
        if slurm.drained_by(self._owner):
            # a resumed rollout whose drain had gone through before the kill
            self._advance(node, Phase.WAITING_JOBS, AuditEvent("drained", node, {"found": True}))
            return
        hold = slurm.hold_reason()
        if hold is not None:
            self._end(
                node,
                Phase.LEFT,
                hold,
                AuditEvent("released", node, {"found": hold}),
                drained=False,
            )
            return
        self._backend.drain(node, self._reason)
        self._advance(node, Phase.WAITING_JOBS, AuditEvent("drained", node))

    def _step_waiting_jobs(self, node: str, reconcile: bool) -> None:
        b, policy = self._backend, self._policy
        start, polls = b.now(), 0
        while True:
            jobs = b.jobs_on(node)
            polls += 1
            if jobs == 0:
                waited = round(b.now() - start, 3)
                self._advance(
                    node,
                    Phase.APPLYING,
                    AuditEvent("jobs-done", node, {"polls": polls, "waited_s": waited}),
                )
                return
            if b.now() - start >= policy.drain_timeout_s:
                self._give_back(
                    node, f"jobs still running after {seconds(policy.drain_timeout_s)} s"
                )
                return
            b.sleep(policy.poll_interval_s)

    def _give_back(self, node: str, why: str) -> None:
        """Drain timeout: gpuctl changed nothing, so it resumes the node (if still its own)."""
        try:
            slurm = self._backend.slurm_node(node)
            if slurm.drained_by(self._owner):
                self._backend.resume(node)
                self._fail(
                    node, Phase.WAITING_JOBS, why, AuditEvent("resumed", node), drained=False
                )
            else:
                left, released = _released(node, slurm)
                reason = f"{why}; {left}" if left else why
                self._fail(node, Phase.WAITING_JOBS, reason, released, drained=False)
        except BackendError as exc:
            self._fail(node, Phase.WAITING_JOBS, f"{why}; could not resume it: {exc}")

    def _after_apply_phase(self) -> Phase:
        return Phase.VERIFYING if self._kind is Restart.NONE else Phase.RESTARTING

    def _step_applying(self, node: str, reconcile: bool) -> None:
        v = self._backend.versions(node, self._component)
        if v.running is None:
            self._fail(node, Phase.APPLYING, "running version unknown")
        elif v.running == self._target:
            self._advance(
                node, Phase.VERIFYING, AuditEvent("apply-skipped", node, {"running": v.running})
            )
        elif v.pending == self._target:
            self._advance(
                node,
                self._after_apply_phase(),
                AuditEvent("apply-skipped", node, {"pending": v.pending}),
            )
        else:
            self._backend.apply(node, self._component, self._target)
            self._advance(
                node,
                self._after_apply_phase(),
                AuditEvent("applied", node, {"from": v.running, "to": self._target}),
            )

    def _step_restarting(self, node: str, reconcile: bool) -> None:
        if reconcile:
            try:
                v = self._backend.versions(node, self._component)
            except BackendError as exc:
                # no answer: the restart is probably under way; wait for it to come back
                self._advance(
                    node, Phase.WAITING_UP, AuditEvent("reconciled", node, {"found": str(exc)})
                )
                return
            if v.running == self._target or (v.pending_known and v.pending != self._target):
                # it restarted already (or the new version is gone: verifying says so); where
                # the staged version cannot be seen, the restart is issued (again): a second
                # power cycle of a drained node is harmless, skipping a needed one is not
                self._advance(
                    node,
                    Phase.VERIFYING,
                    AuditEvent("reconciled", node, {"running": v.running, "pending": v.pending}),
                )
                return
        self._backend.restart(node, self._kind)
        self._advance(
            node, Phase.WAITING_UP, AuditEvent("restart-issued", node, {"kind": str(self._kind)})
        )

    def _step_waiting_up(self, node: str, reconcile: bool) -> None:
        timeout = self._policy.reboot_timeout_s
        if self._backend.wait_up(node, timeout):
            self._advance(node, Phase.VERIFYING, AuditEvent("up", node))
        else:
            self._fail(
                node,
                Phase.WAITING_UP,
                f"{node} did not come back within {seconds(timeout)} s after {self._kind}",
                halts=True,
            )

    def _step_verifying(self, node: str, reconcile: bool) -> None:
        b = self._backend
        if self._kind is not Restart.NONE:
            v = b.versions(node, self._component)
            if v.running == self._target:
                self._advance(
                    node, Phase.VALIDATING, AuditEvent("verified", node, {"running": v.running})
                )
            else:
                self._fail(
                    node,
                    Phase.VERIFYING,
                    f"running {v.running or 'an unknown version'} after {self._kind}, "
                    f"expected {self._target}",
                )
            return
        # no restart: the component resets itself (the BMC); poll until the target is active
        timeout, start = self._policy.reboot_timeout_s, b.now()
        while True:
            try:
                v = b.versions(node, self._component)
                if v.running == self._target:
                    self._advance(
                        node, Phase.VALIDATING, AuditEvent("verified", node, {"running": v.running})
                    )
                    return
                last = f"running {v.running or 'an unknown version'}"
            except BackendError as exc:
                last = str(exc)
            if b.now() - start >= timeout:
                self._fail(
                    node,
                    Phase.VERIFYING,
                    f"{last} {seconds(timeout)} s after the update, expected {self._target}",
                )
                return
            b.sleep(self._policy.poll_interval_s)

    def _step_validating(self, node: str, reconcile: bool) -> None:
        level = self._policy.validate_level
        outcome = self._backend.validate(node, level)
        if outcome.passed:
            self._advance(
                node,
                Phase.RESUMING,
                AuditEvent("validated", node, {"level": level, "result": outcome.reason}),
            )
        else:
            self._fail(node, Phase.VALIDATING, f"validation ({level}) failed: {outcome.reason}")

    def _await_slurmd(self, node: str, done: Callable[[SlurmNode], bool]) -> tuple[SlurmNode, bool]:
        """Slurm's view of ``node`` polled until ``done``, at most ``reboot_timeout_s``."""
        policy = self._policy
        return poll_slurm_node(
            self._backend, node, done, policy.reboot_timeout_s, policy.poll_interval_s
        )

    def _step_resuming(self, node: str, reconcile: bool) -> None:
        # A node back from a reboot is in service again only once its slurmd has registered:
        # until then Slurm shows it NOT_RESPONDING (``idle*``) and it keeps its slot. The
        # resume itself makes Slurm ask the node to register again (NOT_RESPONDING until it
        # has): the slot is given back once it has.
        b, timeout = self._backend, seconds(self._policy.reboot_timeout_s)
        slurm, ok = self._await_slurmd(
            node, lambda s: s.responding or not s.drained_by(self._owner)
        )
        if not ok:
            self._fail(
                node,
                Phase.RESUMING,
                f"slurmd on {node} not responding to slurmctld {timeout} s after "
                f"the update (Slurm state {slurm.state}); left drained",
            )
            return
        if slurm.drained_by(self._owner):
            b.resume(node)
            slurm, ok = self._await_slurmd(node, lambda s: s.responding)
            if not ok:
                self._fail(
                    node,
                    Phase.RESUMING,
                    f"resumed, but slurmd on {node} not responding to slurmctld {timeout} s "
                    f"later (Slurm state {slurm.state})",
                    AuditEvent("resumed", node),
                    drained=False,
                )
                return
            self._end(node, Phase.DONE, "", AuditEvent("resumed", node), drained=False)
        else:
            # re-drained by someone else, or resumed already (by a run that was killed after
            # its resume, or by someone else)
            left, released = _released(node, slurm)
            self._end(node, Phase.DONE, left, released, drained=False)


def _released(node: str, slurm: SlurmNode) -> tuple[str, AuditEvent]:
    """A node gpuctl drained that is no longer drained with gpuctl's reason: what it was left
    as (for the node's reason; empty when it is not drained) and the audit event giving it up."""
    if slurm.is_drained:
        return (
            f"left drained: reason changed by someone else ({slurm.reason})",
            AuditEvent("released", node, {"found": f"drained: {slurm.reason}"}),
        )
    return "", AuditEvent("released", node, {"found": "not drained"})


_STEPS: dict[Phase, Step] = {
    Phase.DRAINING: Executor._step_draining,
    Phase.WAITING_JOBS: Executor._step_waiting_jobs,
    Phase.APPLYING: Executor._step_applying,
    Phase.RESTARTING: Executor._step_restarting,
    Phase.WAITING_UP: Executor._step_waiting_up,
    Phase.VERIFYING: Executor._step_verifying,
    Phase.VALIDATING: Executor._step_validating,
    Phase.RESUMING: Executor._step_resuming,
}
