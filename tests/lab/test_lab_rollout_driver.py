"""`gpuctl rollout --component driver` on the provisioned lab: the nvidia_driver and
fabric_manager roles install a second R570 release from the lab repository (gpuctl/lab/
repo_packages.yml, more_versions), the node reboots (a systemd-nspawn container started again)
and its simulated driver then runs the new version (gpuctl/lab/sim/driver.py: the version
nvidia-smi reports is the kernel module's loaded at boot, not the installed packages').

One node (gpu003) goes to the new version and back, so the tests after this module find the
cluster at one driver version again.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_helpers import GPUCTL, ProvisionedLab, boot_id, gpuctl, sh, slurm
from lab_helpers import on as on_node

from gpuctl.lab import lab
from gpuctl.lab.sim import devices

pytestmark = pytest.mark.lab


def on(node: str, command: str, timeout: float = 300) -> str:
    """lab_helpers.on with this module's longer default (package installs)."""
    return on_node(node, command, timeout)


OLD, NEW = "570.172.08", "570.195.03"  # the lab's pin, and more_versions in repo_packages.yml
NODE = "gpu003"
REASON = f"gpuctl rollout: driver {NEW}"
# what the nvidia_driver role pins (vars/Debian.yml, open modules) and the fabric_manager role's
DRIVER_PACKAGES = ("nvidia-open", "nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-smi",
                   "libnvidia-ml1", "nvidia-persistenced")  # fmt: skip
FM_PACKAGES = ("nvidia-fabricmanager-570", "libnvidia-nscq-570")
APT = (
    "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 --allow-downgrades "
    "--allow-change-held-packages install"
)
MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.195\n"
)


def smi(node: str) -> tuple[int, str]:
    """(exit status, stdout) of the query the rollout and the nvidia_driver role read."""
    res = sh(lab.address_of(node), "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    return res.returncode, res.stdout


def installed(node: str) -> dict[str, str]:
    out = on(node, f"dpkg-query -W {' '.join(DRIVER_PACKAGES + FM_PACKAGES)}")
    return dict(line.split("\t") for line in out.splitlines())


def at(version: str) -> dict[str, str]:
    return dict.fromkeys(DRIVER_PACKAGES + FM_PACKAGES, f"{version}-1")


def wait_idle(node: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while slurm(node)[0] != "idle":
        assert time.monotonic() < deadline, slurm(node)
        time.sleep(2)


def rollout(cluster: Path, state: Path, *args: str) -> tuple[int, Any, str]:
    res = gpuctl("rollout", *args, str(cluster), "--state-dir", str(state), "--json", timeout=900)
    try:
        data = json.loads(res.stdout) if res.stdout.strip() else None
    except ValueError:
        data = None
    return res.returncode, data, res.stderr


def apply_watching_slurm(
    cluster: Path, state: Path, version: str
) -> tuple[int, Any, str, set[tuple[str, str]]]:
    """``rollout apply --component driver --to VERSION --limit NODE``; also the (state, reason)
    pairs sinfo showed for NODE while it ran."""
    seen: set[tuple[str, str]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            res = sh(lab.address_of("ctl01"), f'sinfo -h -N -n {NODE} -o "%T|%E"', timeout=30)
            if res.returncode == 0 and "|" in res.stdout:
                state, reason = res.stdout.strip().splitlines()[0].split("|", 1)
                seen.add((state, reason))
            done.wait(1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        code, data, err = rollout(
            cluster,
            state,
            *("apply", "--component", "driver", "--to", version, "--limit", NODE),
            *("--canary", "1", "--reboot-timeout", "180", "--drain-timeout", "120"),
        )
    finally:
        done.set()
        watcher.join(35)
    return code, data, err, seen


def audit(state: Path) -> list[dict[str, Any]]:
    root = state / "rollouts"
    rid = (root / "current").read_text().strip()
    return [json.loads(x) for x in (root / rid / "audit.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def clusters(provisioned_lab: ProvisionedLab) -> Iterator[tuple[Path, Path]]:
    """(the lab's cluster.yml, a copy pinning NEW) beside each other; NODE back at OLD after."""
    old = provisioned_lab.cluster
    doc = yaml.safe_load(old.read_text(encoding="utf-8"))
    assert doc["software"]["driver"]["version"] == OLD
    doc["software"]["driver"]["version"] = NEW
    new = old.with_name("cluster-driver-new.yml")
    new.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    assert smi(NODE) == (0, f"{OLD}\n" * 8)
    wait_idle(NODE)
    yield old, new
    if smi(NODE) != (0, f"{OLD}\n" * 8) or installed(NODE) != at(OLD):
        # a test failed half-way: the lab's own pin, a reboot, back in service
        res = gpuctl(
            "provision", str(old), "--limit", NODE, "--tags", "nvidia_driver,fabric_manager"
        )
        assert res.returncode == 0, res.stderr[-3000:]
        sh(lab.address_of(NODE), "systemctl reboot", timeout=30)
        time.sleep(5)
        lab.wait_running(NODE, lab.address_of(NODE))
    if slurm(NODE)[0].startswith("drain"):  # left drained by a failed rollout
        on("ctl01", f"scontrol update nodename={NODE} state=resume")
    wait_idle(NODE)
    assert smi(NODE) == (0, f"{OLD}\n" * 8)


def test_upgraded_packages_and_the_old_module_refuse_nvml_until_the_versions_match(
    clusters: tuple[Path, Path], tmp_path: Path
) -> None:
    """The new packages by hand, no reboot: NVML's version mismatch, which a rollout plan
    reads as an unknown running version (fail closed); the old packages again: no reboot
    needed, the loaded module is theirs."""
    _, new = clusters
    boot = boot_id(NODE)
    packages = DRIVER_PACKAGES + FM_PACKAGES
    try:
        on(NODE, f"{APT} {' '.join(f'{p}={NEW}-1' for p in packages)} >/dev/null")
        assert installed(NODE) == at(NEW)
        assert smi(NODE) == (18, MISMATCH)
        full = sh(lab.address_of(NODE), "nvidia-smi")
        assert (full.returncode, full.stdout) == (18, MISMATCH)
        # the /proc/driver/nvidia/version stand-in still names the module loaded at boot
        loaded = on(NODE, f"cat {devices.LOADED_VERSION}")
        assert f"Kernel Module for x86_64  {OLD}  " in loaded
        res = gpuctl(
            "rollout", "plan", "--component", "driver", "--to", NEW, "--limit", NODE,
            str(new), "--json",
        )  # fmt: skip
        assert res.returncode == 1, res.stdout + res.stderr
        plan = json.loads(res.stdout)
        (problem,) = plan["problems"]
        assert (problem["node"], problem["action"]) == (NODE, "unknown"), problem
        assert "exit status 18" in problem["reason"], problem
    finally:
        on(NODE, f"{APT} {' '.join(f'{p}={OLD}-1' for p in packages)} >/dev/null")
        on(NODE, f"apt-mark hold {' '.join(packages)} >/dev/null")
    assert smi(NODE) == (0, f"{OLD}\n" * 8)
    assert boot_id(NODE) == boot


def test_a_driver_rollout_drains_updates_reboots_validates_and_resumes_the_node(
    clusters: tuple[Path, Path], tmp_path: Path
) -> None:
    _, new = clusters
    state = tmp_path / "s"
    res = gpuctl(
        "rollout", "plan", "--component", "driver", "--to", NEW, "--limit", NODE, str(new),
        "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    plan = json.loads(res.stdout)
    assert [(n["node"], n["action"], n["current"]) for n in plan["nodes"]] == [
        (NODE, "update", OLD)
    ]
    before = boot_id(NODE)
    started = time.monotonic()
    code, st, err, seen = apply_watching_slurm(new, state, NEW)
    took = time.monotonic() - started
    assert code == 0, err[-3000:]
    assert st["status"] == "done", st
    assert st["failed"] == []
    assert st["nodes"][NODE]["phase"] == "done", st["nodes"][NODE]
    # drained with gpuctl's reason while it was updated
    assert any(s.startswith("drain") and r == REASON for s, r in seen), seen
    # the new driver runs (the reboot loaded its module) and is what is installed
    assert smi(NODE) == (0, f"{NEW}\n" * 8)
    assert installed(NODE) == at(NEW)
    assert boot_id(NODE) != before
    assert f"Fabric Manager version is : {NEW}" in on(NODE, "nv-fabricmanager --version")
    wait_idle(NODE)
    mine = [x["event"] for x in audit(state) if x.get("node") == NODE]
    steps = ["draining", "applied", "restart-issued", "verified", "validated", "resumed"]
    assert [e for e in mine if e in steps] == steps, mine
    applied = next(x for x in audit(state) if x["event"] == "applied")
    assert (applied["from"], applied["to"]) == (OLD, NEW)
    # the other nodes were not touched
    for other in ("gpu001", "gpu002"):
        assert smi(other) == (0, f"{OLD}\n" * 8)
    print(f"\ndriver rollout of {NODE} to {NEW}: {took:.0f} s")


def test_a_rollout_back_to_the_labs_pin(clusters: tuple[Path, Path], tmp_path: Path) -> None:
    old, _ = clusters
    if smi(NODE) != (0, f"{NEW}\n" * 8):
        pytest.skip(f"{NODE} is not at {NEW} (the rollout test failed)")
    started = time.monotonic()
    code, st, err, seen = apply_watching_slurm(old, tmp_path / "s", OLD)
    took = time.monotonic() - started
    assert code == 0, err[-3000:]
    assert st["status"] == "done", st
    assert st["nodes"][NODE]["phase"] == "done", st["nodes"][NODE]
    assert any(r == f"gpuctl rollout: driver {OLD}" for _, r in seen), seen
    assert smi(NODE) == (0, f"{OLD}\n" * 8)
    assert installed(NODE) == at(OLD)
    held = on(NODE, "apt-mark showhold").split()
    assert set(DRIVER_PACKAGES + FM_PACKAGES) <= set(held)
    wait_idle(NODE)
    print(f"\ndriver rollout of {NODE} back to {OLD}: {took:.0f} s")


def test_the_cluster_validates_at_one_driver_version(
    clusters: tuple[Path, Path], tmp_path: Path
) -> None:
    old, _ = clusters
    res = subprocess.run(
        [GPUCTL, "validate", str(old), "--level", "quick", "--json", "--out", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
