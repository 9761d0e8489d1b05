"""Take failed nodes out of Slurm, and put back the ones gpuctl took out that pass again.

Everything runs on the Slurm controller (cluster.yml's ``slurm.controller``) over the same SSH
as the probes: ``scontrol show node`` first, then ``scontrol update nodename=N state=drain
reason="gpuctl: <check> <detail>; <check> <detail>"`` for each failed node (every failed check
by its id, numbers with their units: :func:`gpuctl.slurm.drain_reason_for`), ``scontrol update
nodename=N state=resume`` for a passing node whose drain reason starts with ``gpuctl:`` and
whose every named check was judged in this run and passed (:func:`gpuctl.slurm.resume_rule`: a
`--level quick` run keeps a node drained for ``nccl.busbw``, which it does not run). The node
states, whose drain it is, the reason format and the resume rule are :mod:`gpuctl.slurm`'s,
shared with node-check and the rollout.

A node drained by gpuctl that fails again keeps the checks its reason names until they pass:
a run that adds a failed check rewrites the reason with both (:func:`gpuctl.slurm.
merged_reason`), one that adds none leaves it (and its time) as it is.

A node drained by someone else (its reason does not start with ``gpuctl:``) is never resumed
and its reason is never overwritten: the operator's drain wins. The plan is a pure function
(:func:`plan`), unit tested without Slurm.

What reaches scontrol is checked at :func:`update_argv`: the node name must be a host name and
the reason is one clean line (:func:`gpuctl.slurm.clean_reason`), whoever built the action. A
reason read back from Slurm (someone else's) is shown through
:func:`~gpuctl.validation.results.printable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuctl.config.model import Level
from gpuctl.remote import ExecResult, Session
from gpuctl.slurm import (
    Owner,
    SlurmNode,
    clean_reason,
    drain_reason_for,
    failure_text,
    merged_reason,
    resume_rule,
)
from gpuctl.slurm import update_argv as scontrol_update
from gpuctl.validation.reports.drain import PREFIX
from gpuctl.validation.results import ValidationReport, printable

SCONTROL_TIMEOUT_S = 60
OWNER = Owner(PREFIX)  # `gpuctl validate --drain-failed` undoes only its own drains
# the level that ran every check validate drained for before reasons named them (long; burn came
# later): a reason that names no checks gpuctl can read is resumed only after a passing run at
# it or above
FULL_LEVEL = Level.LONG.value


@dataclass(frozen=True, slots=True)
class SlurmAction:
    """What gpuctl did (or chose not to do) with one node's Slurm state."""

    node: str
    action: str  # "drain", "resume", or "none" (left as it is)
    reason: str | None  # the drain reason gpuctl wrote (drain) or found (none/resume)
    detail: str  # one line for people
    done: bool = False  # the scontrol update succeeded
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action": self.action,
            "reason": self.reason,
            "detail": self.detail,
            "done": self.done,
            "error": self.error,
        }

    def ended(self, *, error: str | None = None) -> SlurmAction:
        """This action carried out (``error`` None) or failed with ``error``."""
        return SlurmAction(
            self.node, self.action, self.reason, self.detail, done=error is None, error=error
        )


@dataclass(frozen=True, slots=True)
class DrainResult:
    controller: str
    actions: tuple[SlurmAction, ...] = ()
    error: str | None = None  # the controller could not be reached or read

    @property
    def failed(self) -> bool:
        return self.error is not None or any(a.error is not None for a in self.actions)

    def to_json(self) -> dict[str, Any]:
        return {
            "controller": self.controller,
            "error": self.error,
            "actions": [a.to_json() for a in self.actions],
        }


def plan(
    report: ValidationReport, slurm: Mapping[str, Mapping[str, Any]], *, resume: bool = True
) -> list[SlurmAction]:
    """What to do per node of ``report``, given Slurm's records (``scontrol show node``, parsed,
    by node name). Nodes Slurm does not know are left out when they pass, and reported when
    they fail."""
    out: list[SlurmAction] = []
    for node in report.nodes:
        record = slurm.get(node.node)
        state = SlurmNode.from_record(record) if record is not None else None
        current = state.reason if state is not None else None
        drained = state is not None and state.is_drained
        ours = state is not None and state.drained_by(OWNER)
        if node.failed:
            if state is None:
                out.append(SlurmAction(node.node, "none", None, "not a Slurm node"))
            elif drained and not ours:
                out.append(
                    SlurmAction(
                        node.node,
                        "none",
                        current,
                        f"left alone: drained by someone else ({_shown(current)})",
                    )
                )
            elif ours:
                merged = merged_reason(node, current, PREFIX, report.level, FULL_LEVEL)
                if merged is None:
                    out.append(SlurmAction(node.node, "none", current, "already drained by gpuctl"))
                else:
                    out.append(SlurmAction(node.node, "drain", merged, f"drain: {merged}"))
            else:
                reason = (
                    drain_reason_for(node, PREFIX, report.level) or f"{PREFIX} validation failed"
                )
                out.append(SlurmAction(node.node, "drain", reason, f"drain: {reason}"))
        elif drained:
            if ours and resume:
                rule = resume_rule(current, PREFIX, node, report.level, FULL_LEVEL)
                out.append(
                    SlurmAction(
                        node.node, "resume" if rule.resume else "none", current, rule.detail
                    )
                )
            elif not ours:
                out.append(
                    SlurmAction(
                        node.node,
                        "none",
                        current,
                        f"left drained: drained by someone else ({_shown(current)})",
                    )
                )
    return out


def _shown(reason: str | None) -> str:
    return printable(reason) if reason else "no reason"


def update_argv(action: SlurmAction) -> tuple[str, ...]:
    """The `scontrol update` of ``action`` (:func:`gpuctl.slurm.update_argv`), a drain's reason
    made one clean line. Raises ValueError for a node name that is not a host name."""
    if action.action == "drain":
        assert action.reason is not None  # noqa: S101 - drain actions carry their reason
        return scontrol_update(action.node, "drain", clean_reason(action.reason))
    return scontrol_update(action.node, "resume")


def failed(res: ExecResult) -> bool:
    """An scontrol call that did not end with exit 0."""
    return res.rc != 0 or res.error is not None or res.timed_out


def why_failed(what: str, res: ExecResult) -> str:
    """:func:`gpuctl.slurm.failure_text` of a failed scontrol call."""
    return failure_text(what, res.rc, res.stderr, "timed out" if res.timed_out else res.error)


def apply(actions: Sequence[SlurmAction], controller: str, session: Session) -> list[SlurmAction]:
    """Run the scontrol updates of ``actions`` on the controller's ``session``."""
    done: list[SlurmAction] = []
    for action in actions:
        if action.action == "none":
            done.append(action)
            continue
        try:
            argv = update_argv(action)
        except ValueError as exc:
            done.append(
                SlurmAction(
                    action.node, action.action, action.reason, action.detail, error=str(exc)
                )
            )
            continue
        res = session.run(argv, SCONTROL_TIMEOUT_S)
        if failed(res):
            done.append(action.ended(error=why_failed(f"scontrol on {controller}", res)))
        else:
            done.append(action.ended())
    return done
