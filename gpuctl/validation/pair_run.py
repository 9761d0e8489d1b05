"""One perftest run between two sides of a pair (ib_write_bw, ib_write_lat): the server first,
the client once the server prints perftest's ``Waiting for client to connect``.

The collector (:mod:`gpuctl.validation.collector`) calls :func:`run_sides` for each HCA of a
pair and each test, on the two nodes' sessions (one session twice for a loopback), and
:func:`lost_sides` to tell a measurement from a side whose connection died.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuctl.remote import GRACE_S, KILL_AFTER_S, ExecResult, LinkSession
from gpuctl.validation.bundle import said
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.infiniband import judge_ib_write_bw
from gpuctl.validation.judges.latency import judge_ib_write_lat
from gpuctl.validation.probes import (
    IB_WRITE_BW_SERVER_START_S,
    IB_WRITE_BW_TIMEOUT_S,
    IB_WRITE_LAT_TIMEOUT_S,
    SERVER_READY,
    ib_write_bw_client,
    ib_write_bw_server,
    ib_write_lat_client,
    ib_write_lat_server,
    latency_kind,
    perftest_kind,
)
from gpuctl.validation.results import CheckResult


@dataclass(frozen=True, slots=True)
class PairTest:
    """One test a pair runs per HCA: its tool, bundle kind, the two sides' commands, timeout,
    and the judge of one side's output (whether the pair passed; nothing to judge: passed)."""

    tool: str
    kind: Callable[[str], str]
    server: Callable[[str, int, Sequence[str]], tuple[str, ...]]
    client: Callable[[str, int, str, Sequence[str]], tuple[str, ...]]
    timeout_s: int
    judge: Callable[[NodeExpectation, str, ProbeOutput], list[CheckResult]]


BANDWIDTH = PairTest(
    "ib_write_bw",
    perftest_kind,
    ib_write_bw_server,
    ib_write_bw_client,
    IB_WRITE_BW_TIMEOUT_S,
    lambda exp, hca, out: judge_ib_write_bw(exp, {hca: out}),
)
LATENCY = PairTest(
    "ib_write_lat",
    latency_kind,
    ib_write_lat_server,
    ib_write_lat_client,
    IB_WRITE_LAT_TIMEOUT_S,
    lambda exp, hca, out: judge_ib_write_lat(exp, {hca: out}),
)


@dataclass(frozen=True, slots=True)
class Sides:
    """How one run ended on each side: the server's result, the client's (None where it was
    not started or its wait was abandoned for a lost server), and the client's record where
    it did not run (why)."""

    server: ExecResult
    client: ExecResult | None
    not_run: ExecResult


def run_sides(
    s_session: LinkSession,
    c_session: LinkSession,
    s_argv: Sequence[str],
    c_argv: Sequence[str],
    timeout_s: float,
    where: str,
    client: str,
) -> Sides:
    """The server ``s_argv`` on ``s_session``, then the client ``c_argv`` on ``c_session``;
    ``where``: the server as the message names it (``ib_write_bw server on gpu001
    (mlx5_0)``), ``client``: the client's node. A side whose connection dies ends the other at
    once."""
    running = s_session.spawn(s_argv, timeout_s)
    if not running.wait_for(SERVER_READY, IB_WRITE_BW_SERVER_START_S):
        s_res = running.finish(KILL_AFTER_S + GRACE_S)
        why = s_res.error or (
            f"exit {s_res.rc}: {said(s_res.stderr)}"
            if s_res.rc is not None
            else f"no '{SERVER_READY}' within {IB_WRITE_BW_SERVER_START_S} s"
        )
        return Sides(s_res, None, ExecResult(error=f"not run: the {where} did not start: {why}"))
    c_run = c_session.spawn(c_argv, timeout_s)
    c_res = c_run.finish_unless(s_session.lost)  # None: the server's node is lost
    if c_res is None or c_res.lost or c_session.lost() is not None:
        s_res = running.abandon()
    else:
        s_res = running.finish_unless(c_session.lost) or ExecResult(
            error=f"abandoned: {client} was lost"
        )
    return Sides(s_res, c_res, ExecResult(error="not run"))


def lost_sides(
    sides: Sides, server: tuple[str, LinkSession], client: tuple[str, LinkSession]
) -> dict[str, str]:
    """Node -> why its connection died during the run (none: both sides measured)."""
    gone: dict[str, str] = {}
    for (node, session), res in ((server, sides.server), (client, sides.client)):
        why = session.lost() or (res.error if res is not None and res.lost else None)
        if why is not None:
            gone.setdefault(node, why)
    return gone
