"""Running the burn loop on one node (:mod:`gpuctl.validation.burn`).

The collector calls :func:`run` for a node's ``dmon`` probe (level burn), on the node's own
connection, after its other exclusive probes: the GPUs are free. ``nvidia-smi dmon`` samples on
a second channel for the whole loop while the loop's commands run one after the other on the
first. Every command's output is recorded in the node's folder as a probe's is (its own kind,
its command, how it ended, when it was sent and came back), so a loop stopped half-way leaves
the cycles it finished and nothing that looks like more: the judges count what is there against
the duration asked for.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence

from gpuctl.remote import ExecResult, LinkSession
from gpuctl.validation import burn
from gpuctl.validation.bundle import NodeFolder
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.probes import PROBES

Runner = Callable[[LinkSession, Sequence[str], float], ExecResult]
# the probe table's own commands for the reads around the loop (the same readings, again)
XID_ARGV = next(p.argv for p in PROBES if p.kind == "xid")
SMI_ARGV = next(p.argv for p in PROBES if p.kind == "smi-xml")


def _one(
    state: NodeFolder,
    session: LinkSession,
    run_fn: Runner,
    kind: str,
    argv: Sequence[str],
    timeout_s: float,
) -> ExecResult:
    return state.run_recorded(kind, argv, timeout_s, functools.partial(run_fn, session))


def run(
    state: NodeFolder,
    session: LinkSession,
    exp: NodeExpectation,
    duration_s: int,
    run_fn: Runner,
    stopped: Callable[[], bool],
) -> None:
    """The burn loop on ``exp``'s node for ``duration_s`` seconds; ``stopped`` says the
    collection was cancelled (the loop ends after the command that runs)."""
    rules = burn.rules()
    _one(state, session, run_fn, burn.SMI_START, SMI_ARGV, burn.SMI_TIMEOUT_S)
    start = time.monotonic()
    deadline = start + duration_s
    # one dmon per four GPUs, each on its own channel; each ends by itself after its samples,
    # the timeout only bounds a dmon that hangs
    samplers = [
        threading.Thread(
            target=_one,
            args=(
                state,
                session,
                run_fn,
                burn.dmon_kind(group),
                burn.dmon_argv(duration_s, rules.dmon_interval_s, gpus),
                duration_s + 120 + duration_s // 10,
            ),
            name=f"dmon-{exp.node}-{group}",
            daemon=True,
        )
        for group, gpus in enumerate(burn.dmon_groups(exp.gpu_count))
    ]
    for sampler in samplers:
        sampler.start()
    nccl = burn.nccl_argv(exp.gpu_count)
    multi_gpu = exp.gpu_count > 1
    if multi_gpu:
        _one(state, session, run_fn, burn.nccl_kind(0), nccl, burn.NCCL_TIMEOUT_S)
    cycle = 0
    while cycle < burn.MAX_CYCLES and not stopped() and session.lost() is None:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        cycle += 1
        seconds = burn.stress_seconds(left, rules)
        argv = burn.stress_argv(cycle - 1, seconds)
        _one(state, session, run_fn, burn.stress_kind(cycle), argv, seconds + burn.STRESS_SLACK_S)
        if multi_gpu and not stopped():
            _one(state, session, run_fn, burn.nccl_kind(cycle), nccl, burn.NCCL_TIMEOUT_S)
    for sampler in samplers:
        sampler.join()
    if session.lost() is None:
        _one(state, session, run_fn, burn.SMI_END, SMI_ARGV, burn.SMI_TIMEOUT_S)
        _one(state, session, run_fn, burn.XID_END, XID_ARGV, burn.XID_TIMEOUT_S)
