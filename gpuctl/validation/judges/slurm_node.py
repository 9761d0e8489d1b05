"""Slurm's view of a node (``scontrol show node``): down or drained as :mod:`gpuctl.slurm`
defines them, for every caller the same."""

from __future__ import annotations

from gpuctl.slurm import SlurmNode
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import (
    Outputs,
    finding,
    usable_parse,
)
from gpuctl.validation.parsers.slurm import scontrol_nodes_of
from gpuctl.validation.results import CheckResult, Verdict


def judge_slurm_node(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = usable_parse(exp, outputs, ["scontrol-node"], "slurm.state")
    if result is None:
        return unknown
    out = list(unknown)
    nodes = [n for n in scontrol_nodes_of(result.data) if n.name == exp.node]
    if not nodes:
        return [*out, finding(exp, "slurm.state", Verdict.UNKNOWN, "node not in scontrol output")]
    node = nodes[0]
    state = str(node.state or "").lower()
    flags = [str(f).lower() for f in node.state_flags]
    reason = node.reason
    slurm = SlurmNode.from_record(node.state_record())
    if slurm.is_down:
        out.append(
            finding(
                exp,
                "slurm.state",
                Verdict.FAIL,
                f"Slurm state {state}+{'+'.join(flags)}",
                measured=state,
                evidence=(str(reason),) if reason else (),
            )
        )
    elif slurm.is_drained:
        ours = isinstance(reason, str) and reason.startswith("gpuctl:")
        out.append(
            finding(
                exp,
                "slurm.state",
                Verdict.WARN,
                f"drained ({'by gpuctl' if ours else 'by someone else'}): {reason}",
                measured=state,
            )
        )
    else:
        out.append(finding(exp, "slurm.state", Verdict.OK, f"Slurm state {state}", measured=state))
    return out
