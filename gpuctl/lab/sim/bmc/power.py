"""SIMULATION: a lab node's power as its BMC sees it; the node's supervisor is its power switch."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Protocol

from gpuctl.lab import supervisor

LOG = logging.getLogger("gpuctl.lab.sim.bmc")


class PowerControl(Protocol):
    """A node's power as its BMC sees it (the lab: :class:`SupervisorPower`; tests: a fake)."""

    def is_on(self) -> bool: ...
    def force_off(self) -> None: ...
    def graceful_off(self) -> None: ...
    def restart(self, graceful: bool) -> None: ...
    def power_on(self) -> None: ...
    def wait_off(self, timeout: float) -> bool: ...


class SupervisorPower:
    """SIMULATION: the lab node's power, through its supervisor (gpuctl/lab/supervisor.py):
    on = the supervisor runs; off = SIGUSR2 (at once) or SIGTERM (clean shutdown), after which
    the supervisor ends; restart = SIGUSR1 (reset) or SIGHUP (clean reboot); on again = a new
    supervisor (gpuctl.lab.supervisor.start), unless the node's ``no_reboot`` fault keeps it
    down."""

    def __init__(self, node: str, root: Path, run_dir: Path) -> None:
        self.node = node
        self.root = root
        self.run_dir = run_dir
        self.pidfile = run_dir / f"{node}.pid"

    def _pid(self) -> int | None:
        return supervisor.live_pid(self.pidfile, b"gpuctl.lab.supervisor")

    def _signal(self, signum: int) -> None:
        pid = self._pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def is_on(self) -> bool:
        return self._pid() is not None

    def force_off(self) -> None:
        self._signal(signal.SIGUSR2)

    def graceful_off(self) -> None:
        self._signal(signal.SIGTERM)

    def restart(self, graceful: bool) -> None:
        self._signal(signal.SIGHUP if graceful else signal.SIGUSR1)

    def power_on(self) -> None:
        if self.is_on():
            return
        if supervisor.stays_down(str(self.root)):
            LOG.info("%s: stays down (fault no_reboot)", self.node)
            return
        supervisor.start(self.node, self.root, self.run_dir)

    def wait_off(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.is_on():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True
