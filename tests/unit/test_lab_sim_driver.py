"""The lab simulator's driver version across a package upgrade (gpuctl/lab/sim/driver.py):
what is installed (the stand-in packages' version files) against what was loaded at boot (the
kernel module stand-in's record under /run, gpuctl/lab/sim/devices.py).

A node's root is a tmp dir (GPUCTL_SIM_ROOT); "installing" a version writes the files its
packages ship, "booting" empties /run and runs the module stand-in's boot hook.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.lab.sim import devices, driver, profiles, standin
from gpuctl.rollout import tools

OLD, NEW = "570.172.08", "570.195.03"
MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.195\n"
)


class Node:
    """A lab node's files, as far as the driver's version goes."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        hardware = root / "etc/gpuctl-lab/hardware.json"
        hardware.parent.mkdir(parents=True)
        hardware.write_text(profiles.profile_json("hgx-h100-ndr"))
        monkeypatch.setenv("GPUCTL_SIM_ROOT", str(root))
        monkeypatch.setenv("GPUCTL_SIM_PROFILE", str(hardware))
        monkeypatch.setenv("GPUCTL_SIM_FAULTS", str(root / "faults.json"))
        monkeypatch.setenv("GPUCTL_SIM_NODE", "gpu001")

    def install(self, version: str, *, fabricmanager: bool = True) -> None:
        """apt install of the driver set (and Fabric Manager) at ``version``."""
        paths = [driver.NVML_VERSION, devices.MODULE_VERSION]
        paths += [driver.FABRICMANAGER_VERSION] if fabricmanager else []
        for path in paths:
            target = self.root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"{version}\n")

    def boot(self) -> None:
        """A reboot: /run is a fresh tmpfs, the devices unit loads the installed module."""
        shutil.rmtree(self.root / "run", ignore_errors=True)
        devices.load_module()

    def run(self, tool: str, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = standin.main(f"/usr/bin/{tool}", list(args), out, err)
        return rc, out.getvalue(), err.getvalue()

    def smi_version(self) -> tuple[int, str]:
        rc, out, _ = self.run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
        return rc, out


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return Node(tmp_path, monkeypatch)


def test_without_driver_packages_the_profile_version_runs(node: Node) -> None:
    state = driver.read(profiles.load("hgx-h100-ndr"))
    assert state == driver.Driver(library=OLD, loaded=OLD)
    assert state.smi_failure() is None
    assert node.smi_version() == (0, f"{OLD}\n" * 8)


def test_the_module_loads_once_per_boot(node: Node) -> None:
    assert devices.load_module() is None  # no module package: nothing to load
    node.install(OLD)
    assert devices.loaded_module() is None
    assert devices.load_module() == OLD
    proc = (node.root / devices.LOADED_VERSION.lstrip("/")).read_text()
    assert proc.startswith(f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {OLD}  ")
    node.install(NEW)
    assert devices.load_module() == OLD  # modprobe of a loaded module changes nothing
    node.boot()
    assert devices.loaded_module() == NEW


def test_installed_but_not_loaded(node: Node) -> None:
    node.install(OLD)  # e.g. the package unpacked into the image, the node not booted since
    rc, out, _ = node.run("nvidia-smi")
    assert rc == 9
    assert "couldn't communicate with the NVIDIA driver" in out


def test_upgrade_then_reboot(node: Node) -> None:
    node.install(OLD)
    node.boot()
    assert node.smi_version() == (0, f"{OLD}\n" * 8)
    rc, out, _ = node.run("nvidia-smi")
    assert rc == 0
    assert f"Driver Version: {OLD}" in out
    # the package upgrade: user space is new at once, the old module stays loaded
    node.install(NEW)
    for args in ([], ["-q"], ["-L"], ["--query-gpu=driver_version", "--format=csv,noheader"]):
        assert node.run("nvidia-smi", *args) == (18, MISMATCH, ""), args
    rc, out, _ = node.run("nvidia-smi", "-h")  # needs no NVML
    assert rc == 0
    assert f"-- v{NEW}" in out
    assert devices.loaded_module() == OLD  # /proc/driver/nvidia/version's stand-in
    assert f"Kernel Module for x86_64  {OLD}" in node.run("dmesg")[1]
    assert (
        node.run("nvidia-persistenced", "--version")[1] == f"nvidia-persistenced:  version {NEW}\n"
    )
    assert node.run("nv-fabricmanager", "--version")[1] == f"Fabric Manager version is : {NEW}\n"
    # the reboot: every tool shows the new version
    node.boot()
    assert node.smi_version() == (0, f"{NEW}\n" * 8)
    rc, out, _ = node.run("nvidia-smi", "-q")
    assert rc == 0
    assert f"Driver Version                            : {NEW}" in out
    assert "Fabric" in out
    assert f"Kernel Module for x86_64  {NEW}" in node.run("dmesg")[1]
    assert "Driver Version Detected" in node.run("dcgmi", "diag", "-r", "1")[1]


def test_a_downgrade_back_to_the_loaded_version_needs_no_reboot(node: Node) -> None:
    node.install(OLD)
    node.boot()
    node.install(NEW)
    assert node.smi_version()[0] == 18
    node.install(OLD)
    assert node.smi_version() == (0, f"{OLD}\n" * 8)


def test_fabric_manager_of_another_version_than_the_loaded_driver(node: Node) -> None:
    from gpuctl.validation.parsing import parse

    node.install(OLD)
    node.boot()
    node.install(NEW, fabricmanager=False)  # driver upgraded and booted, Fabric Manager left
    node.boot()
    (node.root / driver.FABRICMANAGER_VERSION.lstrip("/")).write_text(f"{OLD}\n")
    rc, out, _ = node.run("nvidia-smi", "-q")
    assert rc == 0
    gpus = parse("smi-q", out).data["gpus"]
    assert {g["fabric"]["state"] for g in gpus} == {"In Progress"}
    node.install(NEW)
    gpus = parse("smi-q", node.run("nvidia-smi", "-q")[1]).data["gpus"]
    assert {g["fabric"]["state"] for g in gpus} == {"Completed"}


def test_the_rollout_parser_fails_closed_on_the_mismatch() -> None:
    """gpuctl rollout reads the running driver with this parser: a node between its package
    upgrade and its reboot has no running version it could trust (a BackendError)."""
    with pytest.raises(tools.ToolOutputError, match="nvidia-smi: exit status 18"):
        tools.parse_driver_running(MISMATCH, 18)
    assert tools.parse_driver_running(f"{NEW}\n" * 8, 0) == NEW


def test_the_packaged_boot_hook_and_modprobe_load_the_module(tmp_path: Path) -> None:
    """devices.py as the kernel module package ships it (a script on its own)."""
    script = Path(devices.__file__)
    module = tmp_path / devices.MODULE_VERSION.lstrip("/")
    module.parent.mkdir(parents=True)
    module.write_text(f"{OLD}\n")
    env = {
        "GPUCTL_SIM_ROOT": str(tmp_path),
        "GPUCTL_SIM_PROFILE": str(tmp_path / "none.json"),  # no GPUs: no mknod needed
        "GPUCTL_SIM_DEV": str(tmp_path / "dev"),
        "PATH": "/usr/bin:/bin",
    }

    def run(*args: str) -> int:
        return subprocess.run(
            [sys.executable, str(script), *args], env=env, check=False, capture_output=True
        ).returncode

    loaded = tmp_path / devices.LOADED_VERSION.lstrip("/")
    assert run("modprobe", "nvidia_peermem") == 0  # needs nvidia: loads it
    assert f"  {OLD}  " in loaded.read_text()
    module.write_text(f"{NEW}\n")
    assert run() == 0  # the unit started again (postinst of an upgrade): still the old module
    assert f"  {OLD}  " in loaded.read_text()
    loaded.unlink()  # a boot
    assert run() == 0
    assert f"  {NEW}  " in loaded.read_text()


def test_fabric_manager_service_starts_beside_an_older_loaded_module(node: Node) -> None:
    """The real nv-fabricmanager refuses to start on another driver version; on a real node the
    nvidia_driver role reboots before the fabric_manager role restarts it. A lab node is a
    container, which the role never reboots: the stand-in starts, and the fabric state (not
    its start) shows the difference until the reboot."""
    node.install(OLD)
    node.boot()
    node.install(NEW)
    assert (
        node.run("nv-fabricmanager", "-c", "/usr/share/nvidia/nvswitch/fabricmanager.cfg")[0] == 0
    )
