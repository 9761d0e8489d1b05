"""nccl-tests across lab nodes under ``srun``: every node's bandwidth reaches rank 0.

Under srun each task runs the stand-in with Slurm's environment (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_NNODES``, ``SLURM_NODEID``, ``SLURM_LOCALID``, ``SLURM_STEP_NODELIST``
or ``SLURM_JOB_NODELIST``, ``SLURM_JOB_ID``, ``SLURM_STEP_ID``). A node's simulator knows only
its own faults, so, like NCCL's bootstrap (rank 0 listens, the other ranks connect to it with
their own information), task 0 listens on a TCP port derived from the job and step ids, and the
first task of every other node connects to the first node of the step (where srun's block
distribution puts task 0) and sends one JSON line: its node name, its GPUs, the bandwidth its
node reaches across nodes with its faults, or why it cannot run. Task 0 prints the whole run's
output with the slowest node's bandwidth, as nccl-tests' rank 0 does; the other tasks print
nothing, except a node that cannot run, whose first task prints its failure line (srun --label
then shows which rank said it). Standard library only.

Environment (tests): GPUCTL_SIM_RANKS_TIMEOUT, the seconds rank 0 waits for the other nodes and
they keep trying to reach it (default 30).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .common import (
    Faults,
    Profile,
    digest,
    fabric_ok,
    hcas,
    nccl_factor,
    recv_line,
    visible_gpus,
)

BASE_PORT = 20_000
PORTS = 10_000
# Per NIC, a multi-node all_reduce reaches about 12 GB/s per 100G, 24 per 200G, 46-48 per 400G
# (NVIDIA/nccl-tests#119, #290, #267): about 0.95 of the line rate. Used when a profile has no
# expected.nccl_multinode_busbw_gbs.
NIC_SHARE = 0.95
SOCKET_GBS = 1.2  # no RDMA port up: NCCL falls back to TCP sockets


@dataclass(frozen=True, slots=True)
class Job:
    rank: int
    ranks: int
    nodes: int
    node_index: int
    local: int
    nodelist: tuple[str, ...]
    port: int

    @property
    def per_node(self) -> int:
        return max(1, self.ranks // max(1, self.nodes))


def expand(nodelist: str) -> list[str]:
    """Slurm's compressed host list (``gpu[001-003,005],ctl01``) as names."""
    names: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if match is None:
            names.append(item)
            continue
        head, ranges, tail = match.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                names.append(f"{head}{low}{tail}")
                continue
            width = len(low)
            names += [f"{head}{i:0{width}d}{tail}" for i in range(int(low), int(high) + 1)]
    return names


def job(env: Mapping[str, str]) -> Job | None:
    """The srun task this process is, or None when it does not run under srun with 2+ tasks."""
    try:
        ranks = int(env["SLURM_NTASKS"])
        rank = int(env["SLURM_PROCID"])
    except (KeyError, ValueError):
        return None
    if ranks < 2:
        return None
    nodelist = expand(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_STEP_NUM_NODES") or len(nodelist) or 1)
    seed = int(env.get("SLURM_JOB_ID") or 0) * 16 + int(env.get("SLURM_STEP_ID") or 0)
    port = int(env.get("GPUCTL_SIM_RANKS_PORT") or BASE_PORT + seed % PORTS)
    return Job(
        rank=rank,
        ranks=ranks,
        nodes=nodes,
        node_index=int(env.get("SLURM_NODEID") or 0),
        local=int(env.get("SLURM_LOCALID") or 0),
        nodelist=tuple(nodelist),
        port=port,
    )


def capacity(profile: Profile, faults: Faults, node: str, hca: str | None = None) -> float:
    """GB/s of busbw this node allows in a multi-node all_reduce, with its faults; with
    ``hca`` (``NCCL_IB_HCA``: ``=mlx5_3`` or ``mlx5_3``, one adapter) through that adapter
    alone: its share of the node's bandwidth, or sockets' when no adapter of that name is up
    (NCCL falls back to its socket transport)."""
    expected = profile["expected"].get("nccl_multinode_busbw_gbs")
    ports = hcas(profile, faults, node)
    if expected is None:
        line = sum(h.max_rate for h in ports) / 8.0
        expected = NIC_SHARE * line if line else SOCKET_GBS
    total = sum(h.max_rate for h in ports)
    if hca is not None:
        named = [h for h in ports if h.name == hca.removeprefix("=")]
        if not total or not named:
            return SOCKET_GBS * nccl_factor(profile, faults)
        expected = float(expected) * sum(h.max_rate for h in named) / total
        ports, total = named, sum(h.max_rate for h in named)
    share = 1.0
    if ports:
        up = sum(h.rate for h in ports if h.active)
        share = up / total if up else SOCKET_GBS / float(expected)
    return float(expected) * nccl_factor(profile, faults) * share


def node_state(
    profile: Profile, faults: Faults, node: str, needed: int, hca: str | None = None
) -> dict[str, Any]:
    """What this node tells rank 0 (``error`` set when its ranks, which use ``needed`` GPUs
    of it, cannot run); ``hca``: NCCL_IB_HCA, the one adapter the run may use."""
    gpus = visible_gpus(profile, faults, node)
    pid = 10_000 + digest(node, "pid") % 50_000
    state: dict[str, Any] = {
        "node": node,
        "pid": pid,
        "gpus": [{"busid": g.bus_id[4:].removesuffix(".0").lower(), "name": g.name} for g in gpus],
        "capacity": capacity(profile, faults, node, hca),
        "wrong": int(faults.get("nccl_wrong") or 0),
        "error": None,
    }
    if needed > len(gpus):
        state["error"] = f"{node}: Test CUDA failure common.cu:1030 'invalid device ordinal'"
    elif not fabric_ok(profile, faults):
        state["error"] = f"{node}: Test CUDA failure common.cu:1030 'system not yet initialized'"
    return state


def _timeout() -> float:
    return float(os.environ.get("GPUCTL_SIM_RANKS_TIMEOUT") or 30.0)


def gather(job: Job, own: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank 0: its own node's state and every other node's, in node order. A node that does
    not report in time is an entry with ``error``."""
    states: dict[int, dict[str, Any]] = {job.node_index: own}
    deadline = time.monotonic() + _timeout()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", job.port))  # noqa: S104 - the nodes' own network
        listener.listen(max(1, job.nodes))
        while len(states) < job.nodes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            listener.settimeout(remaining)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                break
            with conn:
                conn.settimeout(5.0)
                try:
                    report = json.loads(recv_line(conn, 65536).decode("utf-8"))
                except (OSError, ValueError):
                    continue
            if isinstance(report, dict) and isinstance(report.get("index"), int):
                states[report["index"]] = report
    missing = [i for i in range(job.nodes) if i not in states]
    for i in missing:
        name = job.nodelist[i] if i < len(job.nodelist) else f"node {i}"
        states[i] = {
            "node": name,
            "pid": 0,
            "gpus": [],
            "capacity": 0.0,
            "wrong": 0,
            "error": f"{own['node']}: NCCL WARN Bootstrap : no connection from {name} within "
            f"{_timeout():g} s",
        }
    return [states[i] for i in sorted(states)]


def report(job: Job, own: dict[str, Any]) -> bool:
    """Another node's first task: send this node's state to rank 0 (True when delivered)."""
    host = job.nodelist[0] if job.nodelist else "127.0.0.1"
    line = json.dumps({**own, "index": job.node_index}).encode("utf-8") + b"\n"
    deadline = time.monotonic() + _timeout()
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, job.port), timeout=2.0) as conn:
                conn.sendall(line)
                return True
        except OSError:
            time.sleep(0.2)
    return False
