"""Slurm as every part of gpuctl sees it: a node's state, whose drain it is, the scontrol argv.

One model for `gpuctl validate --drain-failed` (:mod:`gpuctl.validation.slurm`), `gpuctl
node-check` (:mod:`gpuctl.validation.nodecheck`), the multi-node run
(:mod:`gpuctl.validation.multinode`) and `gpuctl rollout` (:mod:`gpuctl.rollout`):

- :class:`SlurmNode`: a node's state words (``scontrol show node``'s ``State=IDLE+DRAIN+
  NOT_RESPONDING``, or sinfo's short ``idle*``) and its reason, and what they mean: drained,
  down, not responding, held in another administrative state. To support a new Slurm state, add
  its word to the one set below that says what it means.
- :class:`Owner`: whose drains a tool may undo. Each tool resumes only the nodes it drained
  itself (:meth:`SlurmNode.drained_by`): validate reasons start with ``gpuctl:``, node-check's
  with ``gpuctl node-check:``, a rollout's reason is exactly ``gpuctl rollout: <component>
  <target>``; a reason of anyone else's is never cleared.
- :func:`update_argv`: the one ``scontrol update nodename=N state=drain|resume [reason=R]``;
  :func:`show_argv`, :func:`read_nodes`: ``scontrol show node`` and its records.

Pure: no command is run here. The callers run the argv through their session and word their
own messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuctl.validation.parsers.slurm import SCONTROL_NODE, split_state
from gpuctl.validation.parsing import parse
from gpuctl.validation.results import is_host_name, printable

# The state words, from sinfo(1) "NODE STATE CODES" and scontrol(1) "State=" (Slurm 24.05,
# https://manpages.ubuntu.com/manpages/oracular/en/man1/sinfo.1.html; the flags scontrol joins
# to the base state with "+", e.g. IDLE+DRAIN+NOT_RESPONDING). Base states: ALLOCATED, BLOCKED,
# COMPLETING, DOWN, DRAINED, DRAINING, FAIL, FAILING, FUTURE, IDLE, INVAL, MAINT, MIXED, PLANNED,
# POWER_DOWN, POWERED_DOWN, POWERING_DOWN, POWERING_UP, REBOOT_ISSUED, REBOOT_REQUESTED,
# RESERVED, UNKNOWN. The short form appends one symbol per flag (sinfo's ``idle*``, ``down~``):
# ``*`` not responding, ``~`` powered off, ``#`` powering up or being configured, ``!`` power
# down pending, ``%`` powering down, ``$`` in a maintenance reservation, ``@`` reboot pending,
# ``^`` reboot issued, ``-`` planned for a higher priority job. Words are kept upper case, the
# symbols as they are (``IDLE*`` -> IDLE and ``*``).

# Drained or draining: no new job starts on the node (someone took it out of service).
DRAINED: frozenset[str] = frozenset({"DRAIN", "DRAINED", "DRAINING"})
# slurmctld cannot reach the node's slurmd (it turns DOWN after SlurmdTimeout).
NOT_RESPONDING: frozenset[str] = frozenset({"NOT_RESPONDING", "NO_RESPOND", "*"})
# Down: not usable, whoever drained it or not: down or failed (by Slurm or an administrator),
# not configured yet (FUTURE), not determined since slurmctld started (UNKNOWN), registered
# with less than slurm.conf says (INVAL, the INVALID_REG flag), powered off or being powered
# off, not responding.
DOWN: frozenset[str] = (
    frozenset(
        {
            "DOWN",
            "FAIL",
            "FAILING",
            "FUTURE",
            "UNKNOWN",
            "INVAL",
            "INVALID_REG",
            "POWER_DOWN",
            "POWERED_DOWN",
            "POWERING_DOWN",
            "~",
            "!",
            "%",
        }
    )
    | NOT_RESPONDING
)
# Other administrative states: up, but someone else has the node (maintenance, a reboot, power
# coming back).
HELD: frozenset[str] = frozenset(
    {"MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERING_UP", "$", "@", "^", "#"}
)


def state_words(text: str) -> tuple[str, ...]:
    """``IDLE*+DRAIN`` -> ("IDLE", "DRAIN", "*"): the words joined by ``+``, then the symbols
    each carries (in the order printed); nothing empty."""
    words: list[str] = []
    symbols: list[str] = []
    for part in text.split("+"):
        word, marks = split_state(part)
        if word:
            words.append(word)
        symbols += marks
    return (*words, *symbols)


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose drains a tool may undo: the reasons starting with ``prefix``, or (``exact``) only
    the reason ``prefix`` itself (a rollout's, which names its component and target)."""

    prefix: str
    exact: bool = False

    def owns(self, reason: str | None) -> bool:
        if not reason:
            return False
        return reason == self.prefix if self.exact else reason.startswith(self.prefix)


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """A node as Slurm shows it: its state words, upper case (``IDLE``, ``MIXED``, ``DRAIN``,
    ``DOWN``, ``*``, ...), and the reason set with the last drain or down (None when there is
    none). ``shown``: the state as Slurm printed it, for messages (empty: not read from a
    record)."""

    flags: frozenset[str]
    reason: str | None = None
    shown: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        words = {w for f in self.flags for w in state_words(f.strip().upper())}
        object.__setattr__(self, "flags", frozenset(words))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SlurmNode:
        """A ``scontrol show node`` record as gpuctl's parser returns it (``state``,
        ``state_flags``, ``reason``); a state still joined by ``+`` or carrying its symbols is
        split the same way."""
        base = str(record.get("state") or "")
        flags = [str(f) for f in record.get("state_flags") or []]
        reason = record.get("reason")
        return cls(
            frozenset([base, *flags]),
            reason if isinstance(reason, str) and reason else None,
            "+".join([base or "?", *flags]),
        )

    @property
    def is_drained(self) -> bool:
        """Drained or draining (no new jobs start on it)."""
        return bool(self.flags & DRAINED)

    @property
    def is_down(self) -> bool:
        """Not usable (see ``DOWN``): down, failed, unknown, powered off, not responding."""
        return bool(self.flags & DOWN)

    @property
    def is_held(self) -> bool:
        """In another administrative state (see ``HELD``): maintenance, reboot, powering up."""
        return bool(self.flags & HELD)

    @property
    def state(self) -> str:
        """The words sorted and joined as ``scontrol`` joins them: ``DRAIN+IDLE+NOT_RESPONDING``."""
        return "+".join(sorted(self.flags)) or "no state"

    @property
    def text(self) -> str:
        """The state as Slurm printed it (``IDLE+DRAIN+*``), else :attr:`state`."""
        return self.shown or self.state

    @property
    def responding(self) -> bool:
        """slurmctld reaches the node's slurmd (after a reboot: slurmd has registered again)."""
        return not self.flags & NOT_RESPONDING

    @property
    def only_not_responding(self) -> bool:
        """Not responding, and nothing else about it would keep gpuctl off it."""
        rest = SlurmNode(self.flags - NOT_RESPONDING, self.reason)
        return not self.responding and rest.hold_reason() is None

    def drained_by(self, owner: Owner) -> bool:
        """Resume only what you drained: drained, with a reason ``owner`` wrote."""
        return self.is_drained and owner.owns(self.reason)

    def hold_reason(self) -> str | None:
        """Why a tool must leave this node alone (someone else has it), or None: drained (by
        anyone), down, or in another administrative state."""
        why = f": {self.reason}" if self.reason else ""
        if self.is_drained:
            return f"drained by someone else{why or ' (no reason given)'}"
        if self.is_down:
            return f"down ({self.state}){why}"
        if self.is_held:
            return f"not in service ({self.state}){why}"
        return None


def show_argv(node: str | None = None) -> tuple[str, ...]:
    """``scontrol show node [NODE]``."""
    return ("scontrol", "show", "node") if node is None else ("scontrol", "show", "node", node)


def update_argv(
    node: str, state: Literal["drain", "resume"], reason: str | None = None
) -> tuple[str, ...]:
    """``scontrol update nodename=NODE state=drain reason=REASON`` or ``... state=resume``.
    Raises ValueError for a node name that is not a host name (``a state=resume`` must never
    become two scontrol words) and for a drain without a reason. ``reason`` goes as it is: the
    caller makes it one clean line."""
    if not is_host_name(node):
        raise ValueError(f"scontrol: node name {printable(repr(node))} is not a host name")
    if state == "resume":
        return ("scontrol", "update", f"nodename={node}", "state=resume")
    if not reason:
        raise ValueError(f"scontrol: draining {node} needs a reason")
    return ("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")


class NotUnderstood(ValueError):
    """`scontrol show node` printed something that is not a node record."""


def read_nodes(text: str) -> dict[str, dict[str, Any]]:
    """`scontrol show node [NAME]` output -> parsed records by node name (gpuctl's parser;
    :meth:`SlurmNode.from_record` reads one). Raises :class:`NotUnderstood` with the parser's
    problems when it is not such output."""
    parsed = parse(SCONTROL_NODE, text)
    if not parsed.recognised:
        raise NotUnderstood("; ".join(parsed.problems)[:200])
    return {str(n.get("NodeName")): n for n in parsed.data.get("nodes") or [] if n.get("NodeName")}


def failure_text(what: str, rc: int | None, stderr: bytes, error: str | None) -> str:
    """Why a command (scontrol, squeue, a rollout tool) failed, on one line: its error, else
    its exit status and the last line it printed on stderr."""
    if error:
        return f"{what}: {error}"
    lines = stderr.decode("utf-8", errors="replace").strip().splitlines()
    return f"{what}: exit {rc}" + (f": {lines[-1][:200]}" if lines else "")
