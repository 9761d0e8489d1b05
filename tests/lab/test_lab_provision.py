"""End to end in the lab: `gpuctl provision` of the lab's cluster.yml, as an operator runs it.

Real Ansible over real SSH (host keys checked) through ansible-runner, real apt, systemd, munge
and Slurm in the lab's nodes; the NVIDIA and InfiniBand packages are the lab repository's
stand-ins under their real names and versions (the hardware under them is simulated).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from lab_helpers import COMPUTE, NODES, ProvisionedLab, gpuctl, sh

from gpuctl.config import load_cluster
from gpuctl.lab import lab
from gpuctl.provision import ProgressEvent, provision, read_log, state_dir_for

pytestmark = [pytest.mark.lab, pytest.mark.slow]

HELD = {
    "nvidia-open",
    "nvidia-driver",
    "nvidia-smi",
    "libnvidia-ml1",
    "nvidia-kernel-open-dkms",
    "nvidia-fabricmanager-570",
    "libnccl2",
    "libnccl-dev",
    "datacenter-gpu-manager-4-core",
}


@pytest.fixture
def cluster(provisioned_lab: ProvisionedLab) -> Path:
    return provisioned_lab.cluster


def _ctl(command: str) -> str:
    res = sh(lab.address_of("ctl01"), command)
    assert res.returncode == 0, res.stderr
    return str(res.stdout)


def test_check_on_a_fresh_lab_reports_changes_and_makes_none(
    provisioned_lab: ProvisionedLab,
) -> None:
    record = provisioned_lab.check  # `gpuctl provision --check --json` before anything else
    assert record["check"] is True
    assert record["status"] == "successful"
    assert set(record["hosts"]) == set(NODES)
    assert all(h["changed"] > 0 for h in record["hosts"].values()), record["hosts"]
    assert provisioned_lab.installed_after_check == {n: [] for n in NODES}


def test_provision_installs_a_cluster_that_runs_jobs(provisioned_lab: ProvisionedLab) -> None:
    record = provisioned_lab.first  # the first `gpuctl provision --json`
    assert record["status"] == "successful"
    assert {h: s["failed"] + s["unreachable"] for h, s in record["hosts"].items()} == dict.fromkeys(
        NODES, 0
    )
    nodes = _ctl('sinfo -h -N -o "%N %T %G"')
    assert sorted(nodes.splitlines()) == [f"{n} idle gpu:h100:8" for n in COMPUTE], nodes
    hostnames = _ctl(f"srun -N{len(COMPUTE)} -t 1 hostname")
    assert sorted(hostnames.split()) == list(COMPUTE)
    for node in COMPUTE:
        held = sh(lab.address_of(node), "apt-mark showhold").stdout.split()
        assert set(held) >= HELD, (node, sorted(HELD - set(held)))
        versions = sh(
            lab.address_of(node), "dpkg-query -W nvidia-open libnccl2 nvidia-fabricmanager-570"
        ).stdout.replace("\t", " ")
        assert "nvidia-open 570.172.08-1" in versions
        assert "nvidia-fabricmanager-570 570.172.08-1" in versions
        assert "libnccl2 2.26.2-1+cuda12.8" in versions


def test_second_provision_changes_nothing(cluster: Path) -> None:
    result = provision(
        load_cluster(cluster), cluster_file=cluster, state_dir=state_dir_for(cluster)
    )
    assert result.record.status == "successful", result.record.message
    changed = {h: o.changed for h, o in result.record.hosts.items()}
    assert changed == dict.fromkeys(NODES, 0)


def test_munge_key_is_nowhere_in_the_run_directories(cluster: Path) -> None:
    key = subprocess.run(
        lab.ssh_argv(lab.address_of("ctl01"), ["base64", "-w0", "/etc/munge/munge.key"]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert len(key) > 40
    raw = __import__("base64").b64decode(key)
    runs = cluster.parent / ".gpuctl" / "runs"
    leaks = [
        str(p)
        for p in runs.rglob("*")
        if p.is_file() and (key.encode() in p.read_bytes() or raw in p.read_bytes())
    ]
    assert leaks == []


def test_a_node_lost_mid_run_is_unreachable_and_resume_completes_it(cluster: Path) -> None:
    lost = threading.Event()

    def on_event(event: ProgressEvent) -> None:
        # the node dies once the run is past the preflight, like a crash during an install
        if event.kind == "play" and not event.play.startswith("Preflight") and not lost.is_set():
            lost.set()
            threading.Thread(target=lab.stop_node, args=("gpu002",), daemon=True).start()

    result = provision(
        load_cluster(cluster),
        cluster_file=cluster,
        state_dir=state_dir_for(cluster),
        on_event=on_event,
    )
    assert lost.is_set()
    states = {h: o.state for h, o in result.record.hosts.items()}
    assert states == {**dict.fromkeys(NODES, "ok"), "gpu002": "unreachable"}, states
    assert result.record.status == "failed"
    log = read_log(result.run_dir)
    assert any(r.host == "gpu002" and r.status == "unreachable" for r in log.results)

    lab.start_node("gpu002")
    lab.wait_running("gpu002", lab.address_of("gpu002"))
    res = gpuctl("provision", str(cluster), "--resume", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    record = json.loads(res.stdout)
    assert record["resumed_from"] == result.record.run_id
    assert set(record["hosts"]) == {"gpu002"}
    assert record["status"] == "successful"
    # ReturnToService=1: the rebooted node registers again and is back in service
    deadline = time.monotonic() + 60
    while (state := _ctl("sinfo -h -n gpu002 -o %T").strip()) != "idle":
        assert time.monotonic() < deadline, state
        time.sleep(2)
