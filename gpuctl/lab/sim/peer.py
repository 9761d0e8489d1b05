"""The two sides of a perftest run (``ib_write_bw`` server and client) across lab nodes.

Like perftest's own out-of-band exchange (TCP port 18515 unless ``-p``), the server listens and
waits for one client; the client connects. Each sends one JSON line with its device state (the
HCA's port state, rate, LID and the bandwidth it can reach) and reads the other's. Both then print
their output with the bandwidth of the slower side; a port that is not Active on either side
makes both fail (a client whose port is down tells a waiting server before it exits, where
the real client would leave the server waiting). Standard library only.

Environment (tests): GPUCTL_SIM_CONNECT_TIMEOUT, the seconds a client keeps trying to reach the
server (default 5; the real tool gives up at once, the lab allows for a server starting late).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from .common import Faults, Hca, Profile, recv_line
from .perf import (
    WAITING,
    PerftestArgs,
    ToolFailure,
    ib_write_bw,
    ib_write_lat,
    lat_extra_us,
    peak_gbps,
    pick,
)

EXCHANGE_TIMEOUT = 30.0  # seconds to wait for the other side's line once connected
_NOT_CONNECTED = " Failed to modify QP to RTR\n Unable to Connect the HCA's through the link\n"

StateLoader = Callable[[], tuple[Profile, Faults]]


def _render(args: PerftestArgs) -> Callable[..., str]:
    """The output of the test ``args`` names (ib_write_lat, else a bandwidth test)."""
    return ib_write_lat if args.title == "RDMA_Write Latency Test" else ib_write_bw


def _state(profile: Profile, faults: Faults, node: str, args: PerftestArgs) -> dict[str, Any]:
    """This side's line: the chosen HCA's state (``active`` false when its port is down)."""
    try:
        hca: Hca = pick(profile, faults, node, args)
    except ToolFailure as exc:
        return {"node": node, "active": False, "error": exc.output}
    return {
        "node": node,
        "active": True,
        "device": hca.name,
        "state": hca.state,
        "rate": hca.rate,
        "lid": hca.lid,
        "peak_gbps": peak_gbps(profile, faults, hca),
        "lat_extra_us": lat_extra_us(faults, hca),
    }


def _read_line(conn: socket.socket) -> dict[str, Any]:
    data = recv_line(conn, 4096)
    value = json.loads(data.decode("utf-8")) if data.strip() else None
    if not isinstance(value, dict):
        raise ValueError("no device state from the other side")
    return value


def _send_line(conn: socket.socket, state: dict[str, Any]) -> None:
    conn.sendall(json.dumps(state).encode("utf-8") + b"\n")


def server(load: StateLoader, node: str, args: PerftestArgs, write: Callable[[str], None]) -> str:
    """Wait for one client on ``args.port``, exchange states, return the rest of the output
    (the waiting banner is written through ``write`` first). Raises ToolFailure."""
    profile, faults = load()
    pick(profile, faults, node, args)  # a port that is down fails before listening, as perftest
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # every address of the node, as perftest (INADDR_ANY): the bridge address included
            listener.bind(("0.0.0.0", args.port))  # noqa: S104
            listener.listen(1)
        except OSError as exc:
            raise ToolFailure(
                f" Couldn't listen to port {args.port} ({exc.strerror})\n"
                " Unable to open file descriptor for socket connection"
                " Unable to init the socket connection\n"
            ) from None
        write(WAITING)
        conn, _ = listener.accept()
    with conn:
        conn.settimeout(EXCHANGE_TIMEOUT)
        try:
            remote = _read_line(conn)
            profile, faults = load()  # a fault injected while waiting shows now
            local = _state(profile, faults, node, args)
            _send_line(conn, local)
        except (OSError, ValueError) as exc:
            raise ToolFailure(
                f" Failed to exchange data between server and clients ({exc})\n"
            ) from None
    if not local["active"]:
        raise ToolFailure(str(local["error"]))
    if not remote.get("active"):
        raise ToolFailure(_NOT_CONNECTED)
    return _render(args)(profile, faults, node, args, peer=remote).removeprefix(WAITING)


def _tell_down(node: str, host: str, args: PerftestArgs) -> None:
    """Best effort: a waiting server hears that this side's port is down and fails too (the
    real client fails before connecting and leaves the server waiting; the lab ends both)."""
    try:
        with socket.create_connection((host, args.port), timeout=1.0) as conn:
            conn.settimeout(1.0)
            _send_line(conn, {"node": node, "active": False})
    except OSError:
        pass


def client(load: StateLoader, node: str, args: PerftestArgs) -> str:
    """Connect to the server ``args.server``, exchange states, return the output."""
    host = args.server or "127.0.0.1"
    profile, faults = load()
    try:
        pick(profile, faults, node, args)
    except ToolFailure:
        _tell_down(node, host, args)
        raise
    timeout = float(os.environ.get("GPUCTL_SIM_CONNECT_TIMEOUT") or 5.0)
    deadline = time.monotonic() + timeout
    conn: socket.socket | None = None
    while conn is None:
        try:
            conn = socket.create_connection(
                (host, args.port), timeout=max(0.1, deadline - time.monotonic())
            )
        except OSError:
            if time.monotonic() >= deadline:
                raise ToolFailure(
                    f"Couldn't connect to {host}:{args.port}\n"
                    "Unable to open file descriptor for socket connection"
                    " Unable to init the socket connection\n"
                ) from None
            time.sleep(0.2)
    with conn:
        conn.settimeout(EXCHANGE_TIMEOUT)
        try:
            local = _state(profile, faults, node, args)
            _send_line(conn, local)
            remote = _read_line(conn)
        except (OSError, ValueError) as exc:
            raise ToolFailure(
                f" Failed to exchange data between server and clients ({exc})\n"
            ) from None
    if not remote.get("active"):
        raise ToolFailure(_NOT_CONNECTED)
    return _render(args)(profile, faults, node, args, peer=remote)
