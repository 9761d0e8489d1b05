"""The device nodes a loaded NVIDIA kernel module gives a node, and ``modprobe`` answers for it.

A lab node is a systemd-nspawn container: it has no kernel modules to load, and its /dev is a
tmpfs the container gets fresh on every boot. The stand-in for the kernel module package
(``nvidia-kernel-open-dkms``) ships this file as a script and runs it

- at boot and right after install (a oneshot unit, ``gpuctl-lab-nvidia-devices.service``), and
- for ``modprobe nvidia`` / ``nvidia-uvm`` / ``nvidia-peermem`` / ... through ``install`` lines in
  /etc/modprobe.d (man modprobe.d: "install modulename command...": modprobe runs the command
  instead of inserting the module), so modprobe answers 0 as it does on a GPU node.

It makes real character devices, with the numbers and modes the NVIDIA driver gives them
(major 195: ``/dev/nvidia<N>`` minor N, ``/dev/nvidiactl`` 255, ``/dev/nvidia-modeset`` 254,
mode 0666; https://www.abhik.xyz/concepts/gpu/nvidia-device-files quotes ``ls -la /dev/nvidia*``).
``/dev/nvidia-uvm`` has a dynamic major on real hosts (read from /proc/devices by
nvidia-modprobe); the lab uses 510, a value seen on real hosts. Opening any of them fails with
ENXIO (no driver behind major 195 here): what matters is that they exist, for Slurm's gres.conf
(``File=/dev/nvidia[0-7]``) and for tools that stat them.

N is the node's simulated GPU count, read from its hardware profile (the same file the other
stand-ins read). A node without a profile (a controller) gets no GPU devices.

The same runs "load" the kernel module (:func:`load_module`): the first of them after a boot
records the version of the module the package installed (``MODULE_VERSION``) as the loaded one,
in /proc/driver/nvidia/version's words, under /run (a tmpfs the container gets fresh on every
boot). Later runs change nothing, as modprobe of a loaded module does not, so a package
upgrade leaves the old module "loaded" until the node reboots (gpuctl/lab/sim/driver.py).

Standard library only, no package-relative imports: the package ships this file on its own
(``nvidia-kernel-open-dkms`` is installable without the simulator library).

Environment overrides (tests): GPUCTL_SIM_PROFILE (profile path), GPUCTL_SIM_DEV (/dev),
GPUCTL_SIM_ROOT (the root the driver version files are under, default /).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Sequence

PROFILE_PATH = "/etc/gpuctl-lab/hardware.json"
NVIDIA_MAJOR = 195
UVM_MAJOR = 510
MODE = 0o666
# kernel modules a GPU node loads; dashes and underscores are the same to modprobe
MODULES = ("nvidia", "nvidia-modeset", "nvidia-uvm", "nvidia-drm", "nvidia-peermem")
# the kernel module stand-in's version (its package ships it: what `modinfo -F version nvidia`
# answers on a real node), and the version "loaded" at this boot (/proc/driver/nvidia/version
# on a real node; /proc cannot be written in a container)
MODULE_VERSION = "/usr/lib/gpuctl-lab-sim/driver/module-version"
LOADED_VERSION = "/run/gpuctl-lab-sim/driver/nvidia/version"
_PROC_VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(dvs-builder@U16-I3-B13-4-1)  Tue Feb 25 00:00:00 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
)
_PROC_RE = re.compile(r"^NVRM version: .*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")


def sim_path(path: str) -> str:
    """``path`` under GPUCTL_SIM_ROOT (tests), else itself."""
    root = os.environ.get("GPUCTL_SIM_ROOT", "/")
    return os.path.join(root, path.lstrip("/"))


def _read(path: str) -> str | None:
    try:
        with open(sim_path(path), encoding="utf-8") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def installed_module() -> str | None:
    """The installed kernel module's version; None without the module package."""
    text = (_read(MODULE_VERSION) or "").strip()
    return text or None


def loaded_module() -> str | None:
    """The version loaded at this boot (None: no module loaded since the boot)."""
    text = _read(LOADED_VERSION)
    match = _PROC_RE.match(text or "")
    return match.group(1) if match else None


def load_module() -> str | None:
    """Load the installed module unless one is loaded; the loaded version (None: none)."""
    loaded = loaded_module()
    if loaded is not None:
        return loaded
    version = installed_module()
    if version is None:
        return None
    path = sim_path(LOADED_VERSION)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_PROC_VERSION.format(version=version))
    return version


def gpu_count(profile_path: str | None = None) -> int:
    """The profile's GPU count; 0 when the node has no profile (not a GPU node)."""
    path = profile_path or os.environ.get("GPUCTL_SIM_PROFILE", PROFILE_PATH)
    try:
        with open(path, encoding="utf-8") as handle:
            profile = json.load(handle)
    except FileNotFoundError:
        return 0
    return int(profile["gpus"]["count"])


def device_nodes(count: int) -> list[tuple[str, int, int]]:
    """(name under /dev, major, minor) for a node with ``count`` GPUs; none without GPUs."""
    if count <= 0:
        return []
    nodes = [(f"nvidia{i}", NVIDIA_MAJOR, i) for i in range(count)]
    nodes += [
        ("nvidiactl", NVIDIA_MAJOR, 255),
        ("nvidia-modeset", NVIDIA_MAJOR, 254),
        ("nvidia-uvm", UVM_MAJOR, 0),
        ("nvidia-uvm-tools", UVM_MAJOR, 1),
    ]
    return nodes


def make_devices(dev_dir: str, count: int) -> list[str]:
    """Create the missing device nodes (idempotent); the names created now."""
    made = []
    for name, major, minor in device_nodes(count):
        path = os.path.join(dev_dir, name)
        want = os.makedev(major, minor)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
                os.chmod(path, MODE)
                continue
            os.unlink(path)  # something else under that name: replace it
        os.mknod(path, stat.S_IFCHR | MODE, want)
        os.chmod(path, MODE)  # mknod's mode passes through the umask
        made.append(name)
    return made


def main(argv: Sequence[str]) -> int:
    """``nvidia-devices`` (boot, install) or ``nvidia-devices modprobe MODULE`` (modprobe.d)."""
    dev_dir = os.environ.get("GPUCTL_SIM_DEV", "/dev")
    args = list(argv)
    if args[:1] == ["modprobe"]:
        if len(args) < 2 or args[1].replace("_", "-") not in MODULES:
            sys.stderr.write(f"nvidia-devices: no simulated module {args[1:2]}\n")
            return 1
        module = args[1].replace("_", "-")
    elif args:
        sys.stderr.write("usage: nvidia-devices [modprobe MODULE [OPTIONS...]]\n")
        return 2
    else:
        module = "nvidia"
    try:
        load_module()  # every module of the set needs nvidia (modprobe loads it first)
        if module not in ("nvidia", "nvidia-uvm"):
            return 0  # loading it makes no device node
        count = gpu_count()
        made = make_devices(dev_dir, count)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"nvidia-devices: {exc}\n")
        return 1
    if made:
        print(f"gpuctl lab: created /dev/{{{','.join(made)}}} ({count} simulated GPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
