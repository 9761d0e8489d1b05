"""Slurm drain reasons for failed nodes: `gpuctl: <check> <short detail>`.

Slurm keeps the reason as free text; sinfo -R shows 20 characters by default and long reasons
are unreadable in listings, so gpuctl writes one line of at most REASON_MAX characters, check id
first. The prefix `gpuctl:` marks reasons gpuctl may later clear (it never resumes a node whose
reason it did not write).
"""

from __future__ import annotations

import re

from gpuctl.validation.results import NodeReport, ValidationReport

PREFIX = "gpuctl:"
REASON_MAX = 100


def _clean(text: str) -> str:
    # one line, no quotes or `=` that would confuse `scontrol update ... reason=...`
    return re.sub(r"\s+", " ", re.sub(r"[\"'=\\]", "", text)).strip()


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
    reason = _clean(f"{prefix} {first.check} {detail}")
    if len(reason) + len(more) > REASON_MAX:
        reason = reason[: REASON_MAX - len(more) - 3].rstrip() + "..."
    return reason + more


def drain_reasons(report: ValidationReport) -> dict[str, str]:
    """Node -> reason, for every node the report fails."""
    out: dict[str, str] = {}
    for node in report.nodes:
        if node.failed:
            reason = drain_reason(node)
            if reason is not None:
                out[node.node] = reason
    return out
