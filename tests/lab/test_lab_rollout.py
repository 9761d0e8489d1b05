"""`gpuctl rollout` on the provisioned lab: real Slurm (drains, a running job, resumes), real
reboots of the nodes (systemd-nspawn containers), real SSH; the firmware tool (mlxfwmanager) is
the lab's simulated one, which keeps a burned image pending until the node reboots.

Each test rolls the ConnectX firmware of the compute nodes to a new version (lab-only image
files naming the lab HCAs' PSID) and leaves every node idle, fault-free and resumed; the module
ends with every node back on the profile's firmware.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_helpers import COMPUTE, GPUCTL, ProvisionedLab, gpuctl, on, slurm

from gpuctl.config import load_cluster
from gpuctl.lab import lab

pytestmark = pytest.mark.lab

REASON = "gpuctl rollout: nic-firmware {}"


def fw(node: str) -> tuple[str, str]:
    """(running, flashed) FW of the node's first adapter, from mlxfwmanager --query."""
    text = on(node, "mlxfwmanager --query")
    running = re.search(r"^\s+FW \(Running\)\s+(\S+)", text, re.M)
    flashed = re.search(r"^\s+FW\s+(\S+)", text, re.M)
    assert flashed is not None, text
    return (running.group(1) if running else flashed.group(1)), flashed.group(1)


def verbs_fw(node: str) -> tuple[str, ...]:
    """The distinct firmware versions the node's HCAs report to ibstat and ibv_devinfo."""
    ibstat = re.findall(r"^\s+Firmware version: (\S+)$", on(node, "ibstat"), re.M)
    devinfo = re.findall(r"^\s+fw_ver:\s+(\S+)$", on(node, "ibv_devinfo"), re.M)
    assert ibstat
    assert devinfo
    return tuple(sorted(set(ibstat) | set(devinfo)))


def psid(node: str) -> str:
    m = re.search(r"^\s+PSID:\s+(\S+)", on(node, "mlxfwmanager --query"), re.M)
    assert m is not None
    return m.group(1)


def image(tmp: Path, version: str) -> Path:
    """A lab firmware image from `gpuctl lab firmware-image` (gpuctl/lab/sim/mft.py: a text file
    naming PSID and version), for the PSID the nodes' mlxfwmanager shows."""
    path = tmp / f"fw-{version}.bin"
    res = gpuctl("lab", "firmware-image", version, "-o", str(path))
    assert res.returncode == 0, res.stderr
    assert f"PSID: {psid(COMPUTE[0])}" in path.read_text(encoding="utf-8")
    return path


def wait_idle(nodes: tuple[str, ...] = COMPUTE, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(slurm(n)[0] == "idle" for n in nodes):
            return
        time.sleep(2)
    raise AssertionError({n: slurm(n) for n in nodes})


def rollout(cluster: Path, state: Path, *args: str, timeout: float = 900) -> tuple[int, Any, str]:
    json_opt = ["--json"] if args[0] in ("apply", "resume", "status") else []
    res = gpuctl(
        "rollout", *args, str(cluster), "--state-dir", str(state), *json_opt, timeout=timeout
    )
    try:
        data = json.loads(res.stdout) if res.stdout.strip() else None
    except ValueError:
        data = None
    return res.returncode, data, res.stderr


def audit(state: Path) -> list[dict[str, Any]]:
    root = state / "rollouts"
    rid = (root / "current").read_text().strip()
    return [json.loads(x) for x in (root / rid / "audit.jsonl").read_text().splitlines()]


def apply(version: str, tmp: Path, *more: str, reboot_timeout: int = 120) -> list[str]:
    return [
        "apply",
        "--component",
        "nic-firmware",
        "--to",
        version,
        "--image",
        str(image(tmp, version)),
        "--reboot-timeout",
        str(reboot_timeout),
        "--drain-timeout",
        "300",
        *more,
    ]


@pytest.fixture(scope="module")
def cluster(provisioned_lab: ProvisionedLab) -> Iterator[Path]:
    # the provision installed MFT (the mft role, software.mft in the lab's cluster.yml) from the
    # lab repository's stand-in, at the pinned version and held
    pin = load_cluster(provisioned_lab.cluster).software.mft
    assert pin is not None
    for node in COMPUTE:
        assert on(node, "dpkg-query -W mft").split() == ["mft", pin]
        assert "mft" in on(node, "apt-mark showhold").split()
    wait_idle()
    yield provisioned_lab.cluster
    for node in COMPUTE:
        lab.clear_faults(node)
        # the tests leave the nodes on different lab firmware (gpu003 alone on the last one);
        # the modules after this one validate the whole lab, whose golden-config check
        # (config.hca_firmware) fails an odd node out: back to the profile's firmware on all
        on(node, "rm -f /var/lib/gpuctl-lab-sim/mft.json")
    assert len({verbs_fw(n) for n in COMPUTE}) == 1, {n: verbs_fw(n) for n in COMPUTE}
    wait_idle()


def test_a_rollout_waits_for_the_running_job_and_updates_every_node(
    cluster: Path, tmp_path: Path
) -> None:
    version = "28.99.1001"
    before = {n: fw(n) for n in COMPUTE}
    assert all(r != version for r, _ in before.values())
    # a job on gpu002 that ends 25 s from now
    job = on("ctl01", 'sbatch --parsable -w gpu002 -o /dev/null --wrap "sleep 25"').strip()
    deadline = time.monotonic() + 30
    while on("ctl01", f"squeue -h -j {job} -o %T").strip() != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(1)
    started = time.time()
    code, state, err = rollout(cluster, tmp_path / "s", *apply(version, tmp_path))
    assert code == 0, err[-3000:]
    assert state["status"] == "done"
    assert state["failed"] == []
    assert {n: s["phase"] for n, s in state["nodes"].items()} == dict.fromkeys(COMPUTE, "done")
    # the new firmware runs (it became active with the reboot), nothing is pending
    assert {n: fw(n) for n in COMPUTE} == dict.fromkeys(COMPUTE, (version, version))
    # and so do ibstat and ibv_devinfo (the simulator keeps one firmware state per HCA)
    assert {n: verbs_fw(n) for n in COMPUTE} == dict.fromkeys(COMPUTE, (version,))
    wait_idle()
    lines = audit(tmp_path / "s")
    mine = [x for x in lines if x.get("node") == "gpu002"]
    events = [x["event"] for x in mine]
    # drained first, then waited for the job, then updated
    assert events.index("drained") < events.index("jobs-done") < events.index("applied")
    jobs_done = next(x for x in mine if x["event"] == "jobs-done")
    assert jobs_done["waited_s"] >= 10, jobs_done
    # the job ran to its end (no accounting in the lab: slurmctld keeps the record MinJobAge s)
    assert "JobState=COMPLETED" in on("ctl01", f"scontrol show job {job}")
    assert time.time() - started >= 20
    # one burn per node, canary alone first
    assert Counter(x["node"] for x in lines if x["event"] == "applied") == dict.fromkeys(COMPUTE, 1)


def test_a_node_that_does_not_come_back_halts_the_rollout(cluster: Path, tmp_path: Path) -> None:
    version = "28.99.1002"
    lab.inject_fault("gpu003", "no_reboot")
    try:
        # a short wait: the node never comes back, so the whole timeout elapses (the other
        # tests keep 120 s for nodes that do reboot on a loaded CI machine)
        code, state, err = rollout(
            cluster,
            tmp_path / "s",
            *apply(version, tmp_path, "--limit", "gpu003", reboot_timeout=40),
        )
        assert code == 1
        assert state["status"] == "halted"
        assert (
            "gpu003 did not come back within 40 s"
            in state["reason"] + state["nodes"]["gpu003"]["reason"]
        ), state
        assert "halted" in err
    finally:
        lab.clear_faults("gpu003")
    # the operator powers it on, checks it and resumes it; the rollout is then aborted
    lab.start_node("gpu003")
    lab.wait_running("gpu003", lab.address_of("gpu003"))
    assert slurm("gpu003")[1] in (
        REASON.format(version),
        "Not responding",
        "Node unexpectedly rebooted",
    )
    code, _, err = rollout(cluster, tmp_path / "s", "abort")
    assert code == 0, err
    on("ctl01", "scontrol update nodename=gpu003 state=resume")
    wait_idle()


def test_a_failed_validation_leaves_the_node_drained_with_its_reason(
    cluster: Path, tmp_path: Path
) -> None:
    version = "28.99.1003"
    lab.inject_fault("gpu001", "pcie_degraded", "2")
    try:
        code, state, err = rollout(
            cluster,
            tmp_path / "s",
            *apply(version, tmp_path, "--failure-threshold", "2", "--max-unavailable", "2"),
        )
        assert code == 1, err[-3000:]
        assert state["failed"] == ["gpu001"]
        node = state["nodes"]["gpu001"]
        assert node["failed_phase"] == "validating"
        assert "gpu.pcie" in node["reason"], node
        assert slurm("gpu001") == ("drained", REASON.format(version))
        # the others were updated and are back in service
        assert state["nodes"]["gpu002"]["phase"] == "done"
        assert state["nodes"]["gpu003"]["phase"] == "done"
    finally:
        lab.clear_faults("gpu001")
    on("ctl01", "scontrol update nodename=gpu001 state=resume")
    wait_idle()


def test_a_killed_rollout_resumes_to_the_same_end_state(cluster: Path, tmp_path: Path) -> None:
    version = "28.99.1004"
    state_dir = tmp_path / "s"
    argv = [
        GPUCTL,
        "rollout",
        *apply(version, tmp_path),
        str(cluster),
        "--state-dir",
        str(state_dir),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # kill -9 once the canary has been burned and its reboot issued
        deadline = time.monotonic() + 300
        while True:
            assert time.monotonic() < deadline, "the rollout never reached a reboot"
            assert proc.poll() is None, "the rollout ended before it could be killed"
            try:
                if any(x["event"] == "restart-issued" for x in audit(state_dir)):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    code, st, err = rollout(cluster, state_dir, "status")
    assert st["status"] == "running"  # as the killed process left it
    code, st, err = rollout(cluster, state_dir, "resume")
    assert code == 0, err[-3000:]
    assert st["status"] == "done"
    assert {n: s["phase"] for n, s in st["nodes"].items()} == dict.fromkeys(COMPUTE, "done")
    assert {n: fw(n) for n in COMPUTE} == dict.fromkeys(COMPUTE, (version, version))
    wait_idle()
    lines = audit(state_dir)
    # nobody burned twice, and the resumed run reconciled the node it found in flight
    assert Counter(x["node"] for x in lines if x["event"] == "applied") == dict.fromkeys(COMPUTE, 1)
    assert any(x["event"] == "reconciling" for x in lines)


def test_a_rollout_validates_the_updated_node_at_standard_with_a_partner(
    cluster: Path, tmp_path: Path
) -> None:
    """One node at --validate-level standard: its validation measures ib_write_bw against a
    node outside the rollout (in service, not in its batch), never 'no other reachable node'."""
    version = "28.99.1005"
    state = tmp_path / "s"
    code, result, err = rollout(
        cluster,
        state,
        *apply(version, tmp_path, "--limit", "gpu003", "--validate-level", "standard"),
    )
    assert code == 0, err[-3000:]
    assert result["status"] == "done", result
    root = state / "rollouts"
    rid = (root / "current").read_text().strip()
    bundles = sorted((root / rid / "validate").glob("gpu003-*"))
    assert len(bundles) == 1, bundles
    report = json.loads((bundles[0] / "results.json").read_text())
    node = next(n for n in report["nodes"] if n["node"] == "gpu003")
    bw = [c for c in node["checks"] if c["check"] == "ib.write_bw"]
    assert [c["subject"] for c in bw] == [f"mlx5_{i}" for i in range(8)]
    assert all(c["verdict"] == "ok" and c["measured"] > 375 for c in bw), bw
    assert all("with partner gpu00" in c["message"] for c in bw), bw
    assert [n["node"] for n in report["nodes"]] == ["gpu003"]  # the partner is not judged
    wait_idle()
