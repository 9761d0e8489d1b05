"""The NVIDIA driver's version as a lab node shows it: from what is installed and loaded.

A real node has two driver versions: its user space (libnvidia-ml, nvidia-smi ...), which a
package upgrade replaces at once, and the kernel module, loaded at boot, which the upgrade
leaves running until the next reboot. In between NVML refuses to start::

    $ nvidia-smi
    Failed to initialize NVML: Driver/library version mismatch
    NVML library version: 570.195
    $ echo $?
    18

(both lines on stdout, exit status 18, NVML_ERROR_LIB_RM_VERSION_MISMATCH: anderskm/gputil#55,
mozilla/translations#1167; the second line is the library's major.minor, e.g. "570.124" for
570.124.04 in tinygrad/open-gpu-kernel-modules#47), while /proc/driver/nvidia/version still
names the old module. After the reboot both are the new version.

The lab's stand-in packages say what they are: each ships its upstream version in a file
(``version_file`` in gpuctl/lab/repo_packages.yml): libnvidia-ml1 the library's, the kernel
module package the module's, Fabric Manager its own. The module's version is "loaded" at boot
(:func:`.devices.load_module`, recorded under /run). Where none of these files exist (a unit
test, a node without the driver packages), the hardware profile's ``driver_version`` is both.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .common import Profile
from .devices import MODULE_VERSION, installed_module, loaded_module, sim_path

NVML_VERSION = "/usr/lib/gpuctl-lab-sim/driver/nvml-version"
LIBRARY_KEY = "driver_library_version"  # set by effective_profile: read() of its result agrees
FABRICMANAGER_VERSION = "/usr/lib/gpuctl-lab-sim/driver/fabricmanager-version"
# which stand-in package ships which version file (gpuctl/lab/repo_packages.yml)
VERSION_FILES = {
    "libnvidia-ml1": NVML_VERSION,
    "nvidia-kernel-open-dkms": MODULE_VERSION,
    "nvidia-fabricmanager-570": FABRICMANAGER_VERSION,
}

MISMATCH_STATUS = 18  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
NOT_LOADED_STATUS = 9  # nvidia-smi(1) RETURN VALUE: "NVIDIA driver is not loaded"
NOT_LOADED_TEXT = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running.\n\n"
)


def _version_file(path: str) -> str | None:
    try:
        with open(sim_path(path), encoding="utf-8") as handle:
            text = handle.read().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text or None


@dataclass(frozen=True, slots=True)
class Driver:
    """The node's driver: user space (the NVML library) and the kernel module loaded now."""

    library: str
    loaded: str | None  # None: the module package is installed, no module loaded since boot

    @property
    def running(self) -> str:
        """The version the driver reports (the loaded module's), else the library's."""
        return self.loaded or self.library

    @property
    def mismatch(self) -> bool:
        return self.loaded is not None and self.loaded != self.library

    def smi_failure(self) -> tuple[str, int] | None:
        """(stdout, exit status) of an nvidia-smi that cannot start NVML; None when it can."""
        if self.loaded is None:
            return NOT_LOADED_TEXT, NOT_LOADED_STATUS
        if self.mismatch:
            short = ".".join(self.library.split(".")[:2])
            text = (
                "Failed to initialize NVML: Driver/library version mismatch\n"
                f"NVML library version: {short}\n"
            )
            return text, MISMATCH_STATUS
        return None


def read(profile: Profile) -> Driver:
    """The driver of this node (the profile's version where no stand-in package says more)."""
    library = _version_file(NVML_VERSION) or str(
        profile.get(LIBRARY_KEY) or profile["driver_version"]
    )
    if installed_module() is None:
        # no kernel module package (a test, or a node with the library only): the profile's
        # driver is loaded, as before the lab simulated upgrades
        return Driver(library=library, loaded=library)
    return Driver(library=library, loaded=loaded_module())


def fabricmanager_version() -> str | None:
    """The installed Fabric Manager package's version (None: not installed)."""
    return _version_file(FABRICMANAGER_VERSION)


def effective_profile(profile: Profile) -> Profile:
    """``profile`` with the versions this node runs: ``driver_version`` the loaded module's (what
    NVML, DCGM and the kernel log report) and, on NVSwitch profiles, the installed Fabric
    Manager's. The profile file itself is not changed."""
    drv = read(profile)
    out = dict(profile)
    out["driver_version"] = drv.running
    out[LIBRARY_KEY] = drv.library
    fm = fabricmanager_version()
    firmware = profile.get("firmware")
    if fm and isinstance(firmware, dict) and firmware.get("fabricmanager"):
        out["firmware"] = {**firmware, "fabricmanager": fm}
    return out
