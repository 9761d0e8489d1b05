"""SIMULATION: the lab's BMC process, started by `gpuctl lab up` and ended by `gpuctl lab down`:
``python -m gpuctl.lab.sim.bmc serve CONFIG``; pid file and log ``<lab dir>/run/bmc.{pid,log}``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpuctl.lab import supervisor
from gpuctl.lab.sim.bmc.credentials import bmc_dir, ensure_credentials, load_credentials, state_dir
from gpuctl.lab.sim.bmc.node import BmcSpec
from gpuctl.lab.sim.bmc.power import SupervisorPower
from gpuctl.lab.sim.bmc.service import PORT, BmcService, check_bind_address
from gpuctl.lab.sim.bmc.tls import ensure_tls, server_context
from gpuctl.lab.system import LabError, run, spawn
from gpuctl.lab.system import run_dir as _run_dir

LOG = logging.getLogger("gpuctl.lab.sim.bmc")

_SERVER_MARKER = "gpuctl.lab.sim.bmc"


def _config_file() -> Path:
    return _run_dir() / "bmc.json"


def _pidfile() -> Path:
    return _run_dir() / "bmc.pid"


def server_pid() -> int | None:
    return supervisor.live_pid(_pidfile(), _SERVER_MARKER.encode())


def add_addresses(bridge: str, addresses: Sequence[str]) -> None:
    """Put each BMC address on the lab bridge as a /32 (idempotent): reachable from the host,
    not from the nodes (their 198.18.0.0/24 has no route to them)."""
    have = run(["ip", "-o", "-4", "addr", "show", "dev", bridge]).stdout
    present = {word.split("/")[0] for word in have.split()}
    for address in addresses:
        check_bind_address(address)
        if address not in present:
            run(["ip", "addr", "add", f"{address}/32", "dev", bridge])


def _port_open(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def start(specs: Sequence[BmcSpec], bridge: str, timeout: float = 20) -> bool:
    """Credentials, TLS, the addresses on the bridge, and the server process (restarted when
    the BMCs or the certificate changed). True when the process was started now."""
    ensure_credentials()
    addresses = [s.address for s in specs]
    ensure_tls(addresses)
    add_addresses(bridge, addresses)
    config = {
        "port": PORT,
        "bmcs": [{"node": s.node, "address": s.address, "root": str(s.root)} for s in specs],
        "certificate_sha256": hashlib.sha256((bmc_dir() / "server.pem").read_bytes()).hexdigest(),
    }
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    with contextlib.suppress(OSError):
        if server_pid() is not None and _config_file().read_text(encoding="utf-8") == text:
            return False
    stop_server()
    _config_file().write_text(text, encoding="utf-8")
    proc = spawn(
        [sys.executable, "-m", _SERVER_MARKER, "serve", str(_config_file())],
        _run_dir() / "bmc.log",
        cwd="/",
    )
    _pidfile().write_text(f"{proc.pid}\n", encoding="utf-8")
    deadline = time.monotonic() + timeout
    while not all(_port_open(a, PORT) for a in addresses):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server()
            raise LabError(f"the lab BMCs did not start (see {_run_dir() / 'bmc.log'})")
        time.sleep(0.1)
    return True


def stop_server(timeout: float = 10) -> None:
    pid = server_pid()
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while server_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if server_pid() is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while server_pid() is not None and time.monotonic() < deadline + 5:
                time.sleep(0.05)
    _pidfile().unlink(missing_ok=True)
    _config_file().unlink(missing_ok=True)


def stop() -> None:
    """End the server and forget the BMCs' state (`gpuctl lab down`: the nodes' disks go too).
    The CA, the certificate and the credentials stay."""
    stop_server()
    shutil.rmtree(state_dir(), ignore_errors=True)


def serve(config_path: Path) -> int:
    """The server process: every BMC of the config, until SIGTERM."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s gpuctl-lab-bmc: %(message)s"
    )
    config = json.loads(config_path.read_text(encoding="utf-8"))
    specs = [BmcSpec(b["node"], b["address"], Path(b["root"])) for b in config["bmcs"]]
    username, password = load_credentials()
    run_dir = _run_dir()
    service = BmcService(
        specs,
        username=username,
        password=password,
        context=server_context(),
        state_directory=state_dir(),
        power=lambda s: SupervisorPower(s.node, s.root, run_dir),
        port=int(config.get("port", PORT)),
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    signal.signal(signal.SIGINT, lambda signum, frame: done.set())
    service.start()
    LOG.info("serving %s", ", ".join(f"{s.node} {s.address}:{PORT}" for s in specs))
    while not done.wait(1.0):
        pass
    service.stop()
    LOG.info("stopped")
    return 0


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "serve":
        sys.stderr.write(
            "usage: python -m gpuctl.lab.sim.bmc serve CONFIG (run by gpuctl lab up)\n"
        )
        return 2
    return serve(Path(argv[1]))
