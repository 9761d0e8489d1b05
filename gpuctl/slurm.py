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
- The drain reason of validate and node-check names the checks that failed
  (:func:`drain_reason_for`, read back by :func:`reason_checks`), and :func:`resume_rule` is the
  one rule for taking such a node back: every check its reason names was judged in this run
  and passed (docs/validate.md, "Draining and resuming").

Pure: no command is run here. The callers run the argv through their session and word their
own messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuctl.validation.parsers.slurm import SCONTROL_NODE, split_state
from gpuctl.validation.parsing import parse
from gpuctl.validation.plausible import finite
from gpuctl.validation.results import CheckResult, NodeReport, Verdict, is_host_name, printable

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


# ------------------------------------------------------------------------------------------
# Drain reasons that name their checks, and the one rule for resuming
#
# A reason of validate or node-check: ``<prefix> <check> <detail>; <check> <detail> [<level>]``
# (``gpuctl: nccl.busbw 120 GB/s < 360 GB/s; xid Xid 79 on GPU3 [standard]``): every failed
# check by its id, in report order, then the level of the run that drained the node. Check ids
# come first; when room runs out details are shortened, never an id or the level.

# slurmctld keeps a node's reason as it is given, but slurmdbd records each drain as a node
# event whose reason column is a MySQL TINYTEXT, 255 bytes (SchedMD/slurm,
# src/plugins/accounting_storage/mysql/accounting_storage_mysql.c, event_table_fields): a longer
# reason does not survive in `sacctmgr show event`. gpuctl's reasons fit in it.
REASON_MAX_BYTES = 255
# quick < standard < long < burn (gpuctl.config.model.validation.LEVELS; not imported: this module
# stays free of the config model)
_LEVELS = ("quick", "standard", "long", "burn")

# A check id as the judges write them: "xid", "nccl.busbw", "ib.write_bw.fleet".
_CHECK_ID = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*")
_SPACE = re.compile(r"\s+")  # any white space, Unicode's too (NEL, U+2028, U+3000)
_SCONTROL = re.compile(r"[\"'=\\]")  # what would confuse `scontrol update ... reason=...`
# A family of checks in a reason whose ids do not fit one by one: "nccl.*" is every check
# whose id starts with "nccl." (the ids of one probe family share their first part).
_FAMILY = re.compile(r"[a-z][a-z0-9_]*\.\*")
_SEP = "; "  # between the checks of a reason (never inside one: see _detail)
_LEVEL_TAG = re.compile(r" \[(quick|standard|long|burn)\]$")
# the ending of gpuctl's reasons before they named every check: "(+2 more)" checks unnamed
_OLD_MORE = re.compile(r"\(\+\d+ more\)$")
# Checks whose probe goes deeper at a higher level (dcgmi diag -r 2 at standard, -r 3 at long:
# gpuctl/validation/probes.py): a result at a lower level than the drain proves nothing.
_DEEPER_AT_HIGHER_LEVELS = ("dcgm",)


def clean_reason(text: str, limit: int = REASON_MAX_BYTES) -> str:
    """``text`` as a drain reason: one line of at most ``limit`` bytes (UTF-8), every control
    character escaped (:func:`printable`), no quote, ``=`` or backslash. Idempotent."""
    line = _SCONTROL.sub("", printable(_SPACE.sub(" ", text))).strip()
    return _fit(line, limit)


def _fit(text: str, limit: int) -> str:
    if len(text.encode("utf-8")) <= limit:
        return text
    while text and len(text.encode("utf-8")) > limit - 3:
        text = text[:-1]
    return text.rstrip() + "..."


def _detail(result: CheckResult) -> str:
    """What one failed result says in a reason: the measurement against its threshold, each
    number with its unit (``120 GB/s < 360 GB/s``), else the judge's message; the subject
    (GPU, HCA) first. Never the separator of checks."""
    measured, expected = finite(result.measured), finite(result.expected)
    unit = f" {result.unit}" if result.unit else ""
    if result.verdict is Verdict.UNKNOWN:
        text = f"unknown: {result.message}"
    elif measured is not None and expected is not None and measured != expected and unit:
        sign = "<" if measured < expected else ">"
        text = f"{measured:g}{unit} {sign} {expected:g}{unit}"
    else:
        text = result.message
    if result.subject:
        text = f"{result.subject} {text}"
    return clean_reason(text.replace(";", ","), REASON_MAX_BYTES)


def _segments(problems: Sequence[CheckResult]) -> list[tuple[str, str]]:
    """(check id, detail) per failed check, in report order: the first result of each, with
    how many more of the same check failed."""
    firsts: dict[str, CheckResult] = {}
    counts: dict[str, int] = {}
    for result in problems:
        check = result.check if _CHECK_ID.fullmatch(result.check) else "check"
        firsts.setdefault(check, result)
        counts[check] = counts.get(check, 0) + 1
    out = []
    for check, result in firsts.items():
        more = counts[check] - 1
        out.append((check, _detail(result) + (f", {more} more" if more else "")))
    return out


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def compose_reason(prefix: str, segments: Sequence[tuple[str, str]], level: str) -> str:
    """``<prefix> <check> <detail>; ... [<level>]`` in at most REASON_MAX_BYTES: every check
    id and the level are kept (details are shortened first); where even the ids do not fit,
    the ids of one family by the family (``nccl.*``); where those do not fit either, the last
    part says how many checks are left out (such a reason is read as naming none:
    :func:`reason_checks`)."""
    tag = f" [{level}]"
    ids = [check for check, _ in segments]
    full = prefix + " " + _SEP.join(f"{c} {d}".rstrip() for c, d in segments) + tag
    if _size(full) <= REASON_MAX_BYTES:
        return full
    bare = f"{prefix} " + _SEP.join(ids) + tag
    if _size(bare) > REASON_MAX_BYTES:
        # the checks of one family by the family ("nccl.*": every nccl check), which a run at
        # the drain's level or above proves whole (check_standing)
        ids = _families(ids)
        bare = f"{prefix} " + _SEP.join(ids) + tag
        if _size(bare) <= REASON_MAX_BYTES:
            return bare
        kept: list[str] = []
        for check in ids:
            left = len(ids) - len(kept) - 1
            trial = f"{prefix} " + _SEP.join([*kept, check, f"+{left} more checks"]) + tag
            if _size(trial) > REASON_MAX_BYTES:
                break
            kept.append(check)
        left = len(ids) - len(kept)
        return f"{prefix} " + _SEP.join([*kept, f"+{left} more checks"]) + tag
    # shorten the details (each to an equal share of the room) until the whole fits
    share = (REASON_MAX_BYTES - _size(bare)) // max(1, len(segments)) - 1
    parts = [f"{c} {_fit(d, share) if share >= 8 else ''}".rstrip() for c, d in segments]
    return f"{prefix} " + _SEP.join(parts) + tag


def _families(ids: Sequence[str]) -> list[str]:
    """``ids`` with every first part that two or more of them share as one ``<part>.*``, at
    the place of its first id; the others as they are."""
    counts: dict[str, int] = {}
    for check in ids:
        counts[_family_of(check)] = counts.get(_family_of(check), 0) + 1
    out: list[str] = []
    for check in ids:
        family = _family_of(check)
        name = f"{family}.*" if counts[family] > 1 and "." in check else check
        if name not in out:
            out.append(name)
    return out


def _family_of(check: str) -> str:
    return check.split(".", 1)[0]


def covers(named: str, check: str) -> bool:
    """Whether a check a reason names (an id, or a family ``<part>.*``) is ``check`` or holds
    it."""
    if named.endswith(".*"):
        return check.startswith(named[:-1])
    return named == check


def drain_reason_for(node: NodeReport, prefix: str, level: str) -> str | None:
    """The drain reason of a node that failed a run at ``level``: ``<prefix> nccl.busbw 120
    GB/s < 360 GB/s; xid Xid 79 on GPU3 [standard]``: every failed check (FAIL, and UNKNOWN
    where it fails the node) by its id, with its measurement and unit. None for a node
    without problems."""
    problems = node.problems()
    if not problems:
        return None
    return compose_reason(prefix, _segments(problems), level)


@dataclass(frozen=True, slots=True)
class ReasonRead:
    """What a reason of gpuctl says: its (check id, detail) parts and the level of the run
    that drained the node (None for a reason written before reasons recorded it)."""

    parts: tuple[tuple[str, str], ...]
    level: str | None

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for c, _ in self.parts))


def read_reason(reason: str | None, prefix: str) -> ReasonRead | None:
    """A reason written with ``prefix``, read back; None when it is not ``prefix``'s or does
    not say which checks drained the node (gpuctl's reasons before they named every check
    ended with "(+N more)"; checks left out for room end with "+N more checks")."""
    if not reason or not reason.startswith(prefix):
        return None
    body = reason[len(prefix) :].strip()
    tag = _LEVEL_TAG.search(body)
    level = tag.group(1) if tag else None
    if tag:
        body = body[: tag.start()].rstrip()
    if not body or _OLD_MORE.search(body):
        return None
    parts: list[tuple[str, str]] = []
    for segment in body.split(_SEP):
        check, _, detail = segment.strip().partition(" ")
        if not (_CHECK_ID.fullmatch(check) or _FAMILY.fullmatch(check)):
            return None
        parts.append((check, detail))
    return ReasonRead(tuple(parts), level)


def reason_checks(reason: str | None, prefix: str) -> tuple[str, ...] | None:
    """The check ids a reason of ``prefix`` names (None: it names none gpuctl can read)."""
    read = read_reason(reason, prefix)
    return None if read is None else read.checks


def _rank(level: str | None) -> int:
    return _LEVELS.index(level) if level in _LEVELS else len(_LEVELS)


_PASSING = (Verdict.OK, Verdict.WARN)


def check_standing(node: NodeReport, check: str, level: str, drained_at: str) -> str | None:
    """None when ``check`` was judged on ``node`` in this run (at ``level``) and passed; else
    why not: ``not run``, ``unknown``, ``failed``. Judged: a result of it is in the run (and,
    for a check that goes deeper at higher levels, the run is at the level of the drain at
    least), or the run is at ``drained_at`` or above (it runs every probe the drain ran;
    checks that report only failures then passed by saying nothing)."""
    verdicts = [c.verdict for c in node.checks if covers(check, c.check)]
    if any(v is Verdict.FAIL for v in verdicts):
        return "failed"
    if any(v not in _PASSING for v in verdicts):
        return "unknown"
    # a family (``nccl.*``) names no list of checks: only a run at the drain's level runs
    # every probe of it that the drain ran
    deep = check.split(".", 1)[0] in _DEEPER_AT_HIGHER_LEVELS or bool(_FAMILY.fullmatch(check))
    if _rank(level) >= _rank(drained_at) or (verdicts and not deep):
        return None
    return "not run"


@dataclass(frozen=True, slots=True)
class ResumeRule:
    """Whether a node drained with a tool's reason goes back into service after this run."""

    resume: bool
    detail: str  # one line for people: "resume: ..." or "kept drained: ..."


def resume_rule(
    reason: str | None, prefix: str, node: NodeReport, level: str, full_level: str
) -> ResumeRule:
    """The one rule of `validate --drain-failed` and `node-check` for a node drained with a
    reason that starts with ``prefix``, after a run at ``level`` (``node``: its results):
    resumed only when it passes and every check its reason names was judged in this run and
    passed (:func:`check_standing`). A reason that does not say at which level it was written
    counts as written at ``full_level`` (the tool's most thorough level, which runs every
    check the tool drains for); one that names no checks gpuctl can read resumes only after a
    passing run at ``full_level``."""
    if node.failed:
        return ResumeRule(False, "kept drained: fails this run")
    read = read_reason(reason, prefix)
    if read is None:
        if level == full_level:
            return ResumeRule(
                True, f"resume: passes at level {full_level} (its reason names no checks)"
            )
        return ResumeRule(
            False,
            "kept drained: its reason names no checks gpuctl can read; a passing run at level "
            f"{full_level} resumes it",
        )
    drained_at = read.level or full_level
    standing = {c: check_standing(node, c, level, drained_at) for c in read.checks}
    missing = [c for c, why in standing.items() if why == "not run"]
    bad = [f"{c} {why}" for c, why in standing.items() if why not in (None, "not run")]
    if missing or bad:
        said = [f"{', '.join(missing)} not run at level {level}"] if missing else []
        return ResumeRule(False, "kept drained: " + "; ".join([*said, *bad]))
    return ResumeRule(True, f"resume: {', '.join(read.checks)} passed again")


def merged_reason(
    node: NodeReport, current: str | None, prefix: str, level: str, full_level: str
) -> str | None:
    """A node that failed a run at ``level`` and is drained already with ``prefix``'s reason
    ``current`` (one without a level counts as written at ``full_level``): the reason to write
    now, or None to keep ``current`` as it is (its time stays that of the drain). Rewritten
    only when this run fails a check ``current`` does not name: this run's failures first,
    then the checks of ``current`` that did not pass again, with their old detail; the level
    is the higher of the two. A ``current`` that names no checks gpuctl can read is kept."""
    old = read_reason(current, prefix)
    if old is None:
        return None
    new = _segments(node.problems())
    if all(any(covers(o, c) for o in old.checks) for c, _ in new):
        return None
    drained_at = old.level or full_level
    named = {c for c, _ in new}
    parts = list(new)
    for check, detail in old.parts:
        if any(covers(check, c) for c in named):  # this run failed it (or one of its family)
            continue
        if check_standing(node, check, level, drained_at) is not None:
            parts.append((check, detail))
            named.add(check)
    higher = max(level, drained_at, key=_rank)
    return compose_reason(prefix, parts, higher)
