"""nvidia-fabricmanager as a simulated node shows it: ``nv-fabricmanager --version`` and the
``systemctl status nvidia-fabricmanager`` text (layout of
tests/fixtures/fabric-manager/systemctl-status-fabricmanager-active-running-h100-rhel-ai.txt).
Standard library only.
"""

from __future__ import annotations

import time

from .common import Faults, Profile, digest, fabric_manager_version

_UNIT = "/usr/lib/systemd/system/nvidia-fabricmanager.service"
_EXEC = "/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg"


def version_text(profile: Profile, faults: Faults) -> str | None:
    """``nv-fabricmanager --version``; None where the profile has no fabric manager."""
    version = fabric_manager_version(profile, faults)
    return f"Fabric Manager version is : {version}\n" if version else None


def systemctl_status(profile: Profile, faults: Faults, node: str) -> tuple[str, int]:
    """(text, exit status) of ``systemctl status nvidia-fabricmanager``."""
    version = fabric_manager_version(profile, faults)
    if version is None:
        return "Unit nvidia-fabricmanager.service could not be found.\n", 4
    pid = 2000 + digest(node, "fm") % 5000
    day = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() - 3600))
    short = time.strftime("%b %d %H:%M:%S", time.gmtime(time.time() - 3600))
    loaded = f"     Loaded: loaded ({_UNIT}; enabled; preset: enabled)"
    driver = profile["driver_version"]
    failed = bool(faults.get("fabricmanager_failed")) or version != driver
    if failed:
        # another version than the driver's: FM's own check, worded as the real one prints it
        # (NVIDIA/gpu-operator#544; akash-network/website's provider FAQ shows the unit's
        # journal around it); it exits before it touches the NVSwitches
        said = (
            f"fabric manager NVIDIA GPU driver interface version {version} don't match with "
            f"driver version {driver}. Please update with matching NVIDIA driver package."
            if version != driver
            else "request to query NVSwitch device information from NVSwitch driver failed: "
            "failed to initialize NVSwitch devices"
        )
        lines = [
            "\u00d7 nvidia-fabricmanager.service - NVIDIA fabric manager service",
            loaded,
            f"     Active: failed (Result: exit-code) since {day}; 1h 0min ago",
            f"    Process: {pid} ExecStart={_EXEC} (code=exited, status=1/FAILURE)",
            "        CPU: 31ms",
            "",
            f"{short} {node} systemd[1]: Starting NVIDIA fabric manager service...",
            f"{short} {node} nv-fabricmanager[{pid}]: {said}",
            f"{short} {node} systemd[1]: nvidia-fabricmanager.service: Control process exited, "
            "code=exited, status=1/FAILURE",
            f"{short} {node} systemd[1]: nvidia-fabricmanager.service: Failed with result "
            "'exit-code'.",
            f"{short} {node} systemd[1]: Failed to start NVIDIA fabric manager service.",
        ]
        return "\n".join(lines) + "\n", 3
    lines = [
        "● nvidia-fabricmanager.service - NVIDIA fabric manager service",
        loaded,
        f"     Active: active (running) since {day}; 1h 0min ago",
        f"    Process: {pid} ExecStart={_EXEC} (code=exited, status=0/SUCCESS)",
        f"   Main PID: {pid + 2} (nv-fabricmanage)",
        "      Tasks: 18 (limit: 1649170)",
        "     Memory: 18.1M",
        "        CPU: 4.847s",
        "     CGroup: /system.slice/nvidia-fabricmanager.service",
        f"             └─{pid + 2} {_EXEC}",
        "",
        f"{short} {node} systemd[1]: Starting NVIDIA fabric manager service...",
        f"{short} {node} nv-fabricmanager[{pid + 2}]: Connected to 1 node.",
        f"{short} {node} nv-fabricmanager[{pid + 2}]: Successfully configured all the available "
        "NVSwitches to route GPU NVLink traffic. NVLink Peer-to-Peer support will be enabled once "
        "the GPUs are successfully registered with the NVLink fabric.",
        f"{short} {node} systemd[1]: Started NVIDIA fabric manager service.",
    ]
    return "\n".join(lines) + "\n", 0
