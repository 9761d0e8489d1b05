"""Slurm drain reasons for failed nodes, as `gpuctl report --drain-reasons` prints them.

The format and its rules are :mod:`gpuctl.slurm`'s (one place): ``gpuctl: nccl.busbw 120 GB/s <
360 GB/s; xid Xid 79 on GPU3 [standard]``, every failed check by its id with units, then the
level of the run, at most 255 bytes (slurmdbd's reason column). The prefix `gpuctl:` marks
reasons gpuctl may later clear (it never resumes a node whose reason it did not write).

A reason is one line: a node name or a message can carry tabs, newlines and escape sequences
(a job names its own process; the name lands in an Xid line), and `gpuctl report
--drain-reasons` prints `NODE<TAB>reason` lines that may be piped to scontrol.
"""

from __future__ import annotations

from gpuctl.slurm import REASON_MAX_BYTES, clean_reason, drain_reason_for
from gpuctl.validation.results import NodeReport, ValidationReport

PREFIX = "gpuctl:"
REASON_MAX = REASON_MAX_BYTES

__all__ = ["PREFIX", "REASON_MAX", "clean_reason", "drain_reason", "drain_reasons"]


def drain_reason(node: NodeReport, level: str, prefix: str = PREFIX) -> str | None:
    """``<prefix> <check> <detail>; ... [<level>]`` for a node that failed a run at ``level``,
    or None for a node without problems. `gpuctl node-check` writes its own prefix."""
    return drain_reason_for(node, prefix, level)


def drain_reasons(report: ValidationReport) -> dict[str, str]:
    """Node -> reason, for every node the report fails."""
    out: dict[str, str] = {}
    for node in report.nodes:
        if node.failed:
            reason = drain_reason(node, report.level)
            if reason is not None:
                out[node.node] = reason
    return out
