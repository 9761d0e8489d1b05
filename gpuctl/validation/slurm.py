"""Take failed nodes out of Slurm, and put back the ones gpuctl took out that pass again.

Everything runs on the Slurm controller (cluster.yml's ``slurm.controller``) over the same SSH
as the probes: ``scontrol show node`` first, then ``scontrol update nodename=N state=drain
reason="gpuctl: <check> <detail>"`` for each failed node, ``scontrol update nodename=N
state=resume`` for each passing node whose drain reason starts with ``gpuctl:``.

A node drained by someone else (its reason does not start with ``gpuctl:``) is never resumed
and its reason is never overwritten: the operator's drain wins. The plan is a pure function
(:func:`plan`), unit tested without Slurm.

What reaches scontrol is checked at :func:`update_argv`: the node name must be a host name and
the reason is one clean line (:func:`~gpuctl.validation.reports.drain.clean_reason`), whoever
built the action. A reason read back from Slurm (someone else's) is shown through
:func:`~gpuctl.validation.results.printable`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctl.config import load_cluster
from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.validation.collect import (
    Connector,
    ParamikoConnector,
    Target,
    Unreachable,
    command_line,
    ssh_settings,
)
from gpuctl.validation.parsing import parse
from gpuctl.validation.reports.drain import PREFIX, clean_reason, drain_reason
from gpuctl.validation.results import ValidationReport, is_host_name, printable

SCONTROL_TIMEOUT_S = 60
_DRAIN_STATES = {"DRAIN", "DRAINED", "DRAINING"}
_DOWN_STATES = {"DOWN", "FAIL", "FAILING"}


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


def _state_words(record: Mapping[str, Any]) -> list[str]:
    words = [str(record.get("state") or ""), *(str(f) for f in record.get("state_flags") or [])]
    return [w.upper() for w in words]


def is_drained(record: Mapping[str, Any]) -> bool:
    """Whether a `scontrol show node` record (parsed) is drained or draining."""
    return any(w in _DRAIN_STATES for w in _state_words(record))


def is_down(record: Mapping[str, Any]) -> bool:
    """Whether a `scontrol show node` record (parsed) is down or failed (FAIL, FAILING)."""
    return any(w in _DOWN_STATES for w in _state_words(record))


class NotUnderstood(ValueError):
    """`scontrol show node` printed something that is not a node record."""


def slurm_nodes(text: str) -> dict[str, dict[str, Any]]:
    """`scontrol show node [NAME]` output -> parsed records by node name (gpuctl's parser).
    Raises :class:`NotUnderstood` with the parser's problems when it is not such output."""
    parsed = parse("scontrol-node", text)
    if not parsed.recognised:
        raise NotUnderstood("; ".join(parsed.problems)[:200])
    return {str(n.get("NodeName")): n for n in parsed.data.get("nodes") or [] if n.get("NodeName")}


def plan(
    report: ValidationReport, slurm: Mapping[str, Mapping[str, Any]], *, resume: bool = True
) -> list[SlurmAction]:
    """What to do per node of ``report``, given Slurm's records (``scontrol show node``, parsed,
    by node name). Nodes Slurm does not know are left out when they pass, and reported when
    they fail."""
    out: list[SlurmAction] = []
    for node in report.nodes:
        record = slurm.get(node.node)
        current = record.get("reason") if record is not None else None
        current = current if isinstance(current, str) and current else None
        drained = record is not None and is_drained(record)
        ours = current is not None and current.startswith(PREFIX)
        if node.failed:
            reason = drain_reason(node) or f"{PREFIX} validation failed"
            if record is None:
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
            elif drained and current == reason:
                out.append(SlurmAction(node.node, "none", current, "already drained by gpuctl"))
            else:
                out.append(SlurmAction(node.node, "drain", reason, f"drain: {reason}"))
        elif record is not None and drained:
            if ours and resume:
                out.append(SlurmAction(node.node, "resume", current, "resume: passes again"))
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
    """The `scontrol update` of ``action``. Raises ValueError for a node name that is not a
    host name (`a state=resume` must never become two scontrol words)."""
    if not is_host_name(action.node):
        raise ValueError(f"scontrol: node name {printable(repr(action.node))} is not a host name")
    if action.action == "drain":
        assert action.reason is not None  # noqa: S101 - drain actions carry their reason
        return (
            "scontrol",
            "update",
            f"nodename={action.node}",
            "state=drain",
            f"reason={clean_reason(action.reason)}",
        )
    return ("scontrol", "update", f"nodename={action.node}", "state=resume")


def failure_text(what: str, rc: int | None, stderr: bytes, error: str | None) -> str:
    """Why a Slurm command failed, on one line: its error, else its exit status and the last
    line it printed on stderr."""
    if error:
        return f"{what}: {error}"
    text = stderr.decode("utf-8", errors="replace").strip().splitlines()
    return f"{what}: exit {rc}" + (f": {text[-1][:200]}" if text else "")


def apply(
    actions: Sequence[SlurmAction], controller: str, session: Any, *, become: bool
) -> list[SlurmAction]:
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
        res = session.start(command_line(argv, SCONTROL_TIMEOUT_S, become=become)).finish(
            SCONTROL_TIMEOUT_S + 30
        )
        if res.rc == 0 and res.error is None and not res.timed_out:
            done.append(
                SlurmAction(action.node, action.action, action.reason, action.detail, done=True)
            )
        else:
            err = "timed out" if res.timed_out else None
            done.append(
                SlurmAction(
                    action.node,
                    action.action,
                    action.reason,
                    action.detail,
                    error=failure_text(
                        f"scontrol on {controller}", res.rc, res.stderr, res.error or err
                    ),
                )
            )
    return done


def drain_failed(
    cluster_path: Path,
    report: ValidationReport,
    *,
    resume: bool = True,
    connector: Connector | None = None,
) -> DrainResult:
    """Drain the nodes ``report`` fails and resume those gpuctl drained that pass now."""
    cluster = load_cluster(cluster_path)
    controller = cluster.slurm.controller
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    become = False
    if connector is None:
        settings = ssh_settings(cluster, cluster_path)
        become = settings.become
        connector = ParamikoConnector(settings)
    try:
        try:
            session = connector.connect(Target(controller, address.get(controller, controller)))
        except Unreachable as exc:
            return DrainResult(controller, error=f"cannot reach {controller}: {exc.reason}")
        try:
            argv = ("scontrol", "show", "node")
            res = session.start(command_line(argv, SCONTROL_TIMEOUT_S, become=become)).finish(
                SCONTROL_TIMEOUT_S + 30
            )
            if res.rc != 0 or res.error is not None or res.timed_out:
                why = "timed out" if res.timed_out else res.error
                return DrainResult(
                    controller,
                    error=failure_text(
                        f"scontrol show node on {controller}", res.rc, res.stderr, why
                    ),
                )
            try:
                slurm = slurm_nodes(res.stdout.decode("utf-8", errors="replace"))
            except NotUnderstood as exc:
                return DrainResult(
                    controller,
                    error=f"scontrol show node on {controller}: output not understood ({exc})",
                )
            actions = apply(plan(report, slurm, resume=resume), controller, session, become=become)
            return DrainResult(controller, tuple(actions))
        finally:
            with contextlib.suppress(Exception):
                session.close()
    finally:
        with contextlib.suppress(Exception):
            connector.close()
