"""One lab node's supervisor: runs systemd-nspawn, and starts it again after a reboot.

`systemctl reboot` inside a container makes systemd-nspawn exit with status 133; a real
machine would come back, so the supervisor boots the node again on the same root (its disk
state kept). Any other exit (poweroff, a crash) ends the supervisor. SIGTERM shuts the node down
cleanly (systemd-nspawn passes it on as a halt request) and ends the supervisor.

Run as: python -m gpuctl.lab.supervisor NAME ROOT NETNS PIDFILE
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

REBOOT_STATUS = 133


def nspawn_argv(name: str, root: str, netns: str) -> list[str]:
    return [
        "systemd-nspawn",
        "--quiet",
        "--register=no",  # the host runs no systemd (see shared notes: lab.md)
        "--keep-unit",
        f"--directory={root}",
        f"--network-namespace-path=/run/netns/{netns}",
        f"--machine={name}",
        "--console=read-only",
        "--boot",
    ]


def poweroff(nspawn_pid: int) -> None:
    """Ask the container's systemd to power off (SIGRTMIN+4), as a power button would.

    systemd-nspawn itself does not shut its container down promptly on SIGTERM here; the
    container's init does on SIGRTMIN+4 (systemd's "poweroff" signal).
    """
    try:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        children = []
    if not children:
        os.kill(nspawn_pid, signal.SIGTERM)
        return
    for pid in children:
        try:
            os.kill(int(pid), signal.SIGRTMIN + 4)
        except (ProcessLookupError, ValueError):
            continue


def _stays_down(root: str) -> bool:
    """The simulated fault `no_reboot`: the machine hangs in its reboot and never returns."""
    try:
        faults = json.loads(Path(root, "var/lib/gpuctl-lab-sim/faults.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(faults, dict) and bool(faults.get("no_reboot"))


def main(argv: list[str]) -> int:
    name, root, netns, pidfile = argv
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            poweroff(child.pid)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    Path(pidfile).write_text(f"{os.getpid()}\n", encoding="utf-8")
    boots = 0
    while not stopping:
        boots += 1
        print(f"gpuctl-lab: boot {boots} of {name}", flush=True)
        child = subprocess.Popen(nspawn_argv(name, root, netns), stdin=subprocess.DEVNULL)  # noqa: S603
        Path(pidfile).with_suffix(".nspawn").write_text(f"{child.pid}\n", encoding="utf-8")
        rc = child.wait()
        print(f"gpuctl-lab: {name} exited with {rc}", flush=True)
        if rc != REBOOT_STATUS or stopping:
            break
        if _stays_down(root):
            print(f"gpuctl-lab: {name} does not come back (fault no_reboot)", flush=True)
            break
        time.sleep(0.5)
    Path(pidfile).with_suffix(".nspawn").unlink(missing_ok=True)
    Path(pidfile).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
