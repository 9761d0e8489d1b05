"""`gpuctl rollout` of GPU firmware and BMC firmware through the nodes' BMCs, on the provisioned
lab: real Slurm drains and resumes, real HTTPS with the lab CA checked, HTTP Basic with the
credentials from the lab's Ansible Vault file (or the environment), real power cycles of the
nodes (systemd-nspawn containers stopped and booted again by their supervisor). The BMCs and
the firmware are the lab's SIMULATION (gpuctl/lab/sim/bmc/): GPU firmware stays staged until the
GPUs lose power, a BMC resets itself after its own update.

Each test leaves every node idle, fault-free and resumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_helpers import COMPUTE, GPUCTL, ProvisionedLab, boot_id, gpuctl, on, slurm

from gpuctl.config import load_cluster
from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.lab import lab
from gpuctl.rollout import redfish
from gpuctl.rollout.bmc import BmcAccess, load_credentials

pytestmark = pytest.mark.lab


def vbios(node: str) -> set[str]:
    """The VBIOS versions the node's nvidia-smi shows (one per GPU)."""
    out = on(node, "nvidia-smi --query-gpu=vbios_version --format=csv,noheader")
    return {line.strip() for line in out.splitlines() if line.strip()}


def idle(node: str, timeout: float = 60) -> bool:
    """Idle in sinfo within ``timeout``: after a power cycle slurmd re-registers a few seconds
    after the node is resumed (sinfo shows ``idle*``, not responding, meanwhile)."""
    deadline = time.monotonic() + timeout
    while slurm(node)[0] != "idle":
        if time.monotonic() > deadline:
            return False
        time.sleep(2)
    return True


def package(tmp: Path, component: str, version: str) -> Path:
    path = tmp / f"{component}-{version}.fwpkg"
    res = gpuctl("lab", "firmware-image", version, "-o", str(path), "--component", component)
    assert res.returncode == 0, res.stderr
    return path


def run(
    cluster: Path, state: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[int, Any, str, str]:
    json_opt = ["--json"] if args[0] in ("apply", "resume", "status") else []
    state_opt = [] if args[0] == "plan" else ["--state-dir", str(state)]
    res = subprocess.run(
        [GPUCTL, "rollout", *args, str(cluster), *state_opt, *json_opt],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
    )
    try:
        data = json.loads(res.stdout) if res.stdout.strip() else None
    except ValueError:
        data = None
    return res.returncode, data, res.stdout, res.stderr


def audit(state: Path) -> list[dict[str, Any]]:
    root = state / "rollouts"
    rid = (root / "current").read_text().strip()
    return [json.loads(x) for x in (root / rid / "audit.jsonl").read_text().splitlines()]


def assert_secret_nowhere(secret: str, state: Path, *texts: str) -> None:
    for text in texts:
        assert secret not in text
    for path in state.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


@pytest.fixture(scope="module")
def cluster(provisioned_lab: ProvisionedLab) -> Iterator[Path]:
    yield provisioned_lab.cluster
    for node in COMPUTE:
        lab.clear_faults(node)


def bmc_version(cluster: Path, node: str) -> str:
    access = BmcAccess(cluster, load_cluster(cluster))
    running = access.bmc_versions(node).running
    assert running is not None
    return running


def test_gpu_firmware_is_flashed_through_the_bmc_and_activated_by_a_power_cycle(
    cluster: Path, tmp_path: Path
) -> None:
    version = "96.00.99.00.07"
    original = {n: vbios(n) for n in COMPUTE}
    assert all(v != {version} for v in original.values())
    boots = {n: boot_id(n) for n in COMPUTE}
    state = tmp_path / "s"
    image = package(tmp_path, "gpu-firmware", version)
    code, _, out, err = run(
        cluster, state, "plan", "--component", "gpu-firmware", "--to", version, "--image",
        str(image),
    )  # fmt: skip
    assert code == 0, err[-3000:]
    assert "power-cycle" in out + err
    lab.inject_fault("gpu002", "fw_update_fails")
    try:
        code, st, out, err = run(
            cluster, state, "apply", "--component", "gpu-firmware", "--to", version,
            "--image", str(image), "--max-unavailable", "2", "--failure-threshold", "2",
            "--reboot-timeout", "180",
        )  # fmt: skip
    finally:
        lab.clear_faults("gpu002")
    assert code == 1, err[-3000:]
    # gpu002's BMC failed the update task: it stays drained with gpuctl's reason, not cycled
    assert st["failed"] == ["gpu002"], st
    node = st["nodes"]["gpu002"]
    assert node["failed_phase"] == "applying", node
    assert "Exception" in node["reason"], node
    assert slurm("gpu002") == ("drained", f"gpuctl rollout: gpu-firmware {version}")
    assert boot_id("gpu002") == boots["gpu002"]
    assert vbios("gpu002") == original["gpu002"]
    # the others: flashed, power cycled (new boot), the new VBIOS on every GPU, resumed
    for n in ("gpu001", "gpu003"):
        assert st["nodes"][n]["phase"] == "done", st["nodes"][n]
        assert vbios(n) == {version}
        assert boot_id(n) != boots[n]
        assert idle(n)
    lines = audit(state)
    cycles = [x for x in lines if x["event"] == "restart-issued"]
    assert Counter(x["node"] for x in cycles) == {"gpu001": 1, "gpu003": 1}
    assert all(x["kind"] == "power-cycle" for x in cycles)
    password = load_credentials(cluster, load_cluster(cluster)).secret()
    assert_secret_nowhere(password, state, out, err)
    # the operator looked at gpu002, resumes it in Slurm and rolls it again: done this time
    on("ctl01", "scontrol update nodename=gpu002 state=resume")
    code, st, out, err = run(
        cluster, state, "apply", "--component", "gpu-firmware", "--to", version,
        "--image", str(image), "--reboot-timeout", "180",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    phases = {n: s["phase"] for n, s in st["nodes"].items()}
    assert phases == {"gpu001": "skipped", "gpu002": "done", "gpu003": "skipped"}, phases
    assert vbios("gpu002") == {version}
    assert idle("gpu002")
    assert_secret_nowhere(password, state, out, err)


def test_bmc_firmware_with_credentials_from_the_environment(cluster: Path, tmp_path: Path) -> None:
    version = "lab-bmc-2.7.1"
    creds = load_credentials(cluster, load_cluster(cluster))
    doc = yaml.safe_load(cluster.read_text())
    doc["bmc"]["credentials"] = {"username_env": "LAB_BMC_USER", "password_env": "LAB_BMC_PASS"}
    env_cluster = tmp_path / "cluster.yml"
    env_cluster.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "LAB_BMC_USER": creds.username, "LAB_BMC_PASS": creds.secret()}
    before = {n: bmc_version(cluster, n) for n in ("gpu001", "gpu002")}
    boots = {n: boot_id(n) for n in ("gpu001", "gpu002")}
    assert version not in before.values()
    state = tmp_path / "s"
    image = package(tmp_path, "bmc-firmware", version)
    # without the variables: refused before anything is touched
    bare = {k: v for k, v in env.items() if k not in ("LAB_BMC_USER", "LAB_BMC_PASS")}
    code, _, _, err = run(
        env_cluster, state, "apply", "--component", "bmc-firmware", "--to", version, "--image",
        str(image), "--limit", "gpu[001-002]", env=bare,
    )  # fmt: skip
    assert code == 2
    assert "LAB_BMC_USER, LAB_BMC_PASS" in err
    code, st, out, err = run(
        env_cluster, state, "apply", "--component", "bmc-firmware", "--to", version, "--image",
        str(image), "--limit", "gpu[001-002]", "--reboot-timeout", "120", env=env,
    )  # fmt: skip
    assert code == 0, err[-3000:]
    assert {n: s["phase"] for n, s in st["nodes"].items()} == {"gpu001": "done", "gpu002": "done"}
    for n in ("gpu001", "gpu002"):
        assert bmc_version(cluster, n) == version
        assert boot_id(n) == boots[n]  # the host kept running
        assert idle(n)
    assert not any(x["event"] == "restart-issued" for x in audit(state))
    assert_secret_nowhere(creds.secret(), state, out, err)
    # a wrong password: the BMC refuses (401), the node fails closed, nothing leaks
    env["LAB_BMC_PASS"] = "not-the-password"  # noqa: S105 - a wrong one, on purpose
    code, st, out, err = run(
        env_cluster, tmp_path / "s2", "plan", "--component", "bmc-firmware", "--to",
        "lab-bmc-2.7.2", "--image", str(image), "--limit", "gpu001", env=env,
    )  # fmt: skip
    assert code != 0
    assert "401" in out + err
    assert "not-the-password" not in out + err


def test_the_lab_bmc_checks_its_certificate(cluster: Path) -> None:
    """The lab's CA is what makes its BMCs trusted: without it, the TLS handshake is refused."""
    config = load_cluster(cluster)
    creds = load_credentials(cluster, config)
    address = next(n.bmc_address for n in cluster_nodes(config) if n.name == "gpu001")
    endpoint = redfish.BmcEndpoint(f"https://{address}")  # the system trust store only
    client = redfish.RedfishClient(endpoint, creds, timeout_s=10)
    with pytest.raises(redfish.RedfishTLSError):
        redfish.manager_firmware_version(client)
