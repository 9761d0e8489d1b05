"""Slurm drain reasons for failed nodes: `gpuctl: <check> <short detail>`.

Slurm keeps the reason as free text; sinfo -R shows 20 characters by default and long reasons
are unreadable in listings, so gpuctl writes one line of at most REASON_MAX characters, check id
first. The prefix `gpuctl:` marks reasons gpuctl may later clear (it never resumes a node whose
reason it did not write).

A reason is one line: a node name or a message can carry tabs, newlines and escape sequences
(a job names its own process; the name lands in an Xid line), and `gpuctl report
--drain-reasons` prints `NODE<TAB>reason` lines that may be piped to scontrol.
"""

from __future__ import annotations

import re

from gpuctl.validation.results import NodeReport, ValidationReport, printable

PREFIX = "gpuctl:"
REASON_MAX = 100

_SPACE = re.compile(r"\s+")  # any white space, Unicode's too (NEL, U+2028, U+3000)
_SCONTROL = re.compile(r"[\"'=\\]")


def _clean(text: str) -> str:
    # one line, every other control character escaped (printable), then no quote, `=` or
    # backslash that would confuse `scontrol update ... reason=...`
    return _SCONTROL.sub("", printable(_SPACE.sub(" ", text))).strip()


def _cut(reason: str, room: int) -> str:
    return reason if len(reason) <= room else reason[: room - 3].rstrip() + "..."


def clean_reason(text: str) -> str:
    """``text`` as a drain reason: one line of at most REASON_MAX characters, no control
    character, quote, `=` or backslash. What gpuctl gives `scontrol update ... reason=`."""
    return _cut(_clean(text), REASON_MAX)


def drain_reason(node: NodeReport, prefix: str = PREFIX) -> str | None:
    """``<prefix> <first failed check> <detail>`` (at most REASON_MAX characters), or None for
    a node without problems. `gpuctl node-check` writes its own prefix (see nodecheck.py)."""
    problems = node.problems()
    if not problems:
        return None
    first = problems[0]
    detail = first.message
    if first.subject:
        detail = f"{first.subject} {detail}"
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return _cut(_clean(f"{prefix} {first.check} {detail}"), REASON_MAX - len(more)) + more


def drain_reasons(report: ValidationReport) -> dict[str, str]:
    """Node -> reason, for every node the report fails."""
    out: dict[str, str] = {}
    for node in report.nodes:
        if node.failed:
            reason = drain_reason(node)
            if reason is not None:
                out[node.node] = reason
    return out
