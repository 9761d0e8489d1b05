"""One lab node's supervisor: runs systemd-nspawn, boots it again after a reboot, and is the
node's power switch (for `gpuctl lab down` and for the lab's SIMULATED BMC, gpuctl/lab/sim/bmc/).

`systemctl reboot` inside a container makes systemd-nspawn exit with status 133; a real
machine would come back, so the supervisor boots the node again on the same root (its disk
state kept). Any other exit (poweroff, a crash) ends the supervisor.

Signals (the supervisor acts on them within about 0.2 s, also while the node is busy):

- ``SIGTERM``, ``SIGINT``: clean shutdown. The container's systemd is asked to power off
  (SIGRTMIN+4, as a power button would); if it has not stopped after ``SHUTDOWN_GRACE_S`` it is
  killed. The supervisor ends (`gpuctl lab down`; Redfish ``GracefulShutdown``).
- ``SIGUSR2``: power off at once. The container's init is killed with SIGKILL, which ends every
  process of the container, as losing power would. The supervisor ends (Redfish ``ForceOff``,
  the first half of ``PowerCycle``).
- ``SIGUSR1``: reset. Killed at once as with SIGUSR2, then booted again on the same root
  (Redfish ``ForceRestart``).
- ``SIGHUP``: clean restart. The container's systemd is asked to reboot (SIGRTMIN+5, what
  `systemctl reboot` does); systemd-nspawn exits 133 and the node is booted again (Redfish
  ``GracefulRestart``). Killed and booted again if it has not stopped after
  ``SHUTDOWN_GRACE_S``.

Every boot but the first checks the ``no_reboot`` fault (faults.json on the node's disk): with
it, the node stays down and the supervisor ends. A supervisor that ended means the node is
powered off; the BMC powers it on by starting a new supervisor (:func:`start`, also what
gpuctl.lab.lab.start_node runs).

Run as: python -m gpuctl.lab.supervisor NAME ROOT NETNS PIDFILE
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from gpuctl.lab.system import LabError, spawn

REBOOT_STATUS = 133
SHUTDOWN_GRACE_S = 60.0
_KILL_RETRY_S = 5.0
_POLL_S = 0.2

# what each signal asks for (see the module docstring)
STOP = "stop"  # clean shutdown, then end
OFF = "off"  # power off at once, then end
RESET = "reset"  # power off at once, boot again
REBOOT = "reboot"  # clean restart
REQUESTS = {
    signal.SIGTERM: STOP,
    signal.SIGINT: STOP,
    signal.SIGUSR2: OFF,
    signal.SIGUSR1: RESET,
    signal.SIGHUP: REBOOT,
}


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


def _container_init(nspawn_pid: int) -> list[int]:
    """The container's init (systemd-nspawn's child: PID 1 inside the container)."""
    try:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return []
    return [int(pid) for pid in children if pid.isdigit()]


def _signal_init(nspawn_pid: int, signum: int) -> bool:
    """Send ``signum`` to the container's init; False when there is none (yet)."""
    sent = False
    for pid in _container_init(nspawn_pid):
        try:
            os.kill(pid, signum)
            sent = True
        except ProcessLookupError:
            continue
    return sent


def poweroff(nspawn_pid: int) -> None:
    """Ask the container's systemd to power off (SIGRTMIN+4), as a power button would.

    systemd-nspawn itself does not shut its container down promptly on SIGTERM here; the
    container's init does on SIGRTMIN+4 (systemd's "poweroff" signal).
    """
    if not _signal_init(nspawn_pid, signal.SIGRTMIN + 4):
        _kill(nspawn_pid, signal.SIGTERM)


def reboot(nspawn_pid: int) -> None:
    """Ask the container's systemd to reboot (SIGRTMIN+5, systemd's "reboot" signal)."""
    if not _signal_init(nspawn_pid, signal.SIGRTMIN + 5):
        _kill(nspawn_pid, signal.SIGTERM)


def force_off(nspawn_pid: int) -> None:
    """Kill the container's init: the kernel ends every process of its PID namespace with it
    (power lost). Before the container has an init, systemd-nspawn is asked to stop."""
    if not _signal_init(nspawn_pid, signal.SIGKILL):
        _kill(nspawn_pid, signal.SIGTERM)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


# ------------------------------------------------------------------------------------------
# Starting a supervisor (powering a node on), from the lab and from its BMC


def netns_name(name: str) -> str:
    """The network namespace node ``name`` runs in."""
    return f"gpuctl-{name}"


def alive(pid: int | None) -> bool:
    """Running (a zombie is not: the supervisor may be a child of this very process)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it when it is ours
        return False
    return True


def live_pid(pidfile: Path, marker: bytes | None = None) -> int | None:
    """The pid in ``pidfile`` when that process runs (and, given ``marker``, has it in its
    command line); None otherwise."""
    try:
        pid = int(pidfile.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    if not alive(pid):
        return None
    if marker is None:
        return pid
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if marker in cmdline else None


def start(name: str, root: Path, run_dir: Path) -> None:
    """Power node ``name`` on: start its supervisor (``<run_dir>/<name>.pid``, log
    ``<name>.log``) unless one runs, and wait for it (raises LabError)."""
    pidfile = run_dir / f"{name}.pid"
    if live_pid(pidfile) is not None:
        return
    spawn(
        [
            sys.executable,
            "-m",
            "gpuctl.lab.supervisor",
            name,
            str(root),
            netns_name(name),
            str(pidfile),
        ],
        run_dir / f"{name}.log",
    )
    deadline = time.monotonic() + 10
    while live_pid(pidfile) is None:
        if time.monotonic() > deadline:
            raise LabError(f"{name}: the supervisor did not start (see {run_dir}/{name}.log)")
        time.sleep(0.1)


def stays_down(root: str) -> bool:
    """The simulated fault `no_reboot`: the machine hangs in its reboot and never returns."""
    try:
        faults = json.loads(Path(root, "var/lib/gpuctl-lab-sim/faults.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(faults, dict) and bool(faults.get("no_reboot"))


def supervise(child: subprocess.Popen[bytes], requests: list[str]) -> tuple[int, str | None]:
    """Wait for the container to exit, acting on the requests the signals queue up; returns
    its exit status and what was asked of it last (None: nothing, it stopped by itself)."""
    action: str | None = None
    deadline: float | None = None  # when a request not yet done turns into a kill
    kills = 0
    while True:
        while requests:
            request = requests.pop(0)
            now = time.monotonic()
            if request == OFF or (request == RESET and action not in (STOP, OFF)):
                action = OFF if request == OFF or action == OFF else RESET
                force_off(child.pid)
                deadline = now + _KILL_RETRY_S
            elif request == STOP and action not in (STOP, OFF):
                action = STOP
                poweroff(child.pid)
                deadline = now + SHUTDOWN_GRACE_S
            elif request == REBOOT and action is None:
                action = REBOOT
                reboot(child.pid)
                deadline = now + SHUTDOWN_GRACE_S
        try:
            return child.wait(timeout=_POLL_S), action
        except subprocess.TimeoutExpired:
            pass
        if deadline is not None and time.monotonic() > deadline:
            kills += 1
            print(f"gpuctl-lab: {action}: the container did not stop, killing it", flush=True)
            if kills > 2:  # no init to kill and nspawn does not end: nspawn itself
                _kill(child.pid, signal.SIGKILL)
            else:
                force_off(child.pid)
            deadline = time.monotonic() + _KILL_RETRY_S


def main(argv: list[str]) -> int:
    name, root, netns, pidfile = argv
    requests: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        requests.append(REQUESTS[signal.Signals(signum)])

    for signum in REQUESTS:
        signal.signal(signum, on_signal)
    nspawn_pidfile = Path(pidfile).with_suffix(".nspawn")
    Path(pidfile).write_text(f"{os.getpid()}\n", encoding="utf-8")
    boots = 0
    while not any(r in (STOP, OFF) for r in requests):
        requests[:] = [r for r in requests if r in (STOP, OFF)]  # it boots now anyway
        if boots and stays_down(root):
            print(f"gpuctl-lab: {name} does not come back (fault no_reboot)", flush=True)
            break
        boots += 1
        print(f"gpuctl-lab: boot {boots} of {name}", flush=True)
        child = subprocess.Popen(nspawn_argv(name, root, netns), stdin=subprocess.DEVNULL)  # noqa: S603
        nspawn_pidfile.write_text(f"{child.pid}\n", encoding="utf-8")
        rc, action = supervise(child, requests)
        nspawn_pidfile.unlink(missing_ok=True)
        print(
            f"gpuctl-lab: {name} exited with {rc}" + (f" ({action})" if action else ""), flush=True
        )
        if action in (RESET, REBOOT) or (action is None and rc == REBOOT_STATUS):
            time.sleep(0.5)
            continue
        break
    nspawn_pidfile.unlink(missing_ok=True)
    Path(pidfile).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
