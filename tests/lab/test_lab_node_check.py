"""gpuctl's node check on the shared provisioned lab, as Slurm runs it.

`gpuctl provision` of the lab's cluster.yml with ``slurm.health_check`` turned on installs
gpuctl on the compute nodes from the lab's wheelhouse (built on the host by `gpuctl lab up`:
the nodes have no internet) with the gpuctl_node_check role, and names the wrapper in
slurm.conf as HealthCheckProgram with a short interval. Then: the check passes on a healthy
node (and how long it takes); a fault on gpu002 makes it fail and drain gpu002 with a
`gpuctl node-check:` reason, and clearing the fault resumes it; a node an operator drained
stays drained; and slurmd runs the check by itself within the interval. The module turns the
health check off again (and clears what it injected) before it ends.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_helpers import COMPUTE, ProvisionedLab, gpuctl, sh

from gpuctl.lab import lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NODE = "gpu002"
INTERVAL_S = 15  # HealthCheckInterval here; the default is 300
TAGS = "gpuctl_node_check,slurm_controller,slurm_node"
PROGRAM = "/usr/local/sbin/gpuctl-node-check"
FAULT = ("pcie_degraded", "2")  # quick level, no kernel log lines: no reboot needed


def _provision(cluster: Path, *extra: str, tags: str = TAGS) -> dict[str, Any]:
    res = gpuctl("provision", str(cluster), "--tags", tags, "--json", *extra, timeout=1200)
    assert res.returncode == 0, res.stderr[-5000:]
    record: dict[str, Any] = json.loads(res.stdout)
    return record


def _on(node: str, command: str, timeout: float = 120) -> Any:
    return sh(lab.address_of(node), command, timeout=timeout)


def _drained() -> dict[str, str]:
    res = _on("ctl01", 'sinfo -R -h -N -o "%N|%E"')
    assert res.returncode == 0, res.stderr
    return dict(ln.split("|", 1) for ln in res.stdout.splitlines() if "|" in ln)


def _wait_for(what: str, predicate: Any, timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            pytest.fail(f"{what}: not within {timeout:.0f} s; drained: {_drained()}")
        time.sleep(1)
    return time.monotonic() - start


def _check(node: str, *args: str) -> tuple[int, dict[str, Any], float]:
    """Run the wrapper on ``node`` as Slurm would (plus ``args``): exit status, JSON, seconds."""
    start = time.monotonic()
    res = _on(node, f"{PROGRAM} --json {' '.join(args)}")
    seconds = time.monotonic() - start
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return res.returncode, json.loads(res.stdout), seconds


def _resume_if_ours(node: str) -> None:
    if _drained().get(node, "").startswith("gpuctl node-check:"):
        _on("ctl01", f"scontrol update nodename={node} state=resume")


@pytest.fixture(scope="module")
def health_lab(
    provisioned_lab: ProvisionedLab, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The provisioned lab with slurm.health_check on (interval INTERVAL_S); off again after."""
    doc = yaml.safe_load(provisioned_lab.cluster.read_text(encoding="utf-8"))
    assert doc["package_sources"]["gpuctl_wheelhouse"], "gpuctl lab up writes the wheelhouse"
    doc["slurm"]["health_check"] = {"enabled": True, "interval_s": INTERVAL_S}
    cluster = tmp_path_factory.mktemp("node-check") / "cluster.yml"
    cluster.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    # check mode on nodes without gpuctl: reports the changes, makes none. The role alone: in
    # check mode slurm_node's preflight requires the program to be installed already
    checked = _provision(cluster, "--check", tags="gpuctl_node_check")
    assert all(checked["hosts"][n]["changed"] > 0 for n in COMPUTE), checked["hosts"]
    assert all(_on(n, "test -e /opt/gpuctl").returncode == 1 for n in COMPUTE)
    record = _provision(cluster)
    assert record["status"] == "successful", record
    try:
        yield cluster
    finally:
        lab.clear_faults(NODE)
        _provision(provisioned_lab.cluster)  # health check off: slurm.conf without it
        for node in COMPUTE:
            _resume_if_ours(node)


def test_provisioning_installs_the_check_and_slurmd_names_it(health_lab: Path) -> None:
    for node in COMPUTE:
        freeze = _on(node, "/opt/gpuctl/bin/python -m pip freeze --all").stdout
        assert "gpuctl==0.1.0" in freeze.splitlines(), freeze
        assert "ansible" not in freeze.lower()  # only what node-check needs
        stat = _on(node, f"stat -c %a:%U /etc/gpuctl/cluster.yml {PROGRAM}").stdout.split()
        assert stat == ["644:root", "755:root"]
        copy = yaml.safe_load(_on(node, "cat /etc/gpuctl/cluster.yml").stdout)
        assert "ssh" not in copy
        assert "package_sources" not in copy
        config = _on(node, "scontrol show config").stdout
        assert re.search(rf"^HealthCheckProgram\s*=\s*{PROGRAM}$", config, re.M), config
        assert re.search(rf"^HealthCheckInterval\s*=\s*{INTERVAL_S} sec$", config, re.M)
        assert re.search(r"^HealthCheckNodeState\s*=\s*ANY$", config, re.M)


def test_a_second_provision_changes_nothing(health_lab: Path) -> None:
    for extra in ((), ("--check",)):
        record = _provision(health_lab, *extra)
        changed = {h: s["changed"] for h, s in record["hosts"].items()}
        assert changed == dict.fromkeys(changed, 0), (extra, changed)


def test_a_healthy_node_passes_in_a_second_or_two(health_lab: Path) -> None:
    times = []
    for _ in range(3):
        rc, data, seconds = _check("gpu001")
        assert rc == 0, data["report"]["nodes"][0]["checks"]
        assert (data["node"], data["level"], data["verdict"]) == ("gpu001", "quick", "ok")
        assert data["slurm"]["action"] == "none"
        times.append(seconds)
    # through ssh, Python's start, the imports, seven probes and scontrol show node
    assert min(times) < 5, times
    print(f"gpuctl-node-check on gpu001 (quick, through ssh): {times}")
    # on the node itself, as slurmd starts it: the whole program, and its start alone (--help)
    timer = (
        "import subprocess, sys, time; t = time.monotonic(); "
        "r = subprocess.run(sys.argv[1:], capture_output=True); "
        "print(r.returncode, round(time.monotonic() - t, 3))"
    )
    for argv in (PROGRAM, f"{PROGRAM} --help"):
        runs = [_on("gpu001", f'python3 -c "{timer}" {argv}').stdout.split() for _ in range(5)]
        assert all(rc == "0" for rc, _ in runs), runs
        print(f"on gpu001: {argv}: {sorted(float(s) for _, s in runs)} s")
    print(f"node_check() itself (after the imports): {data['seconds']} s")


def test_a_fault_drains_the_node_and_clearing_it_resumes(health_lab: Path) -> None:
    lab.inject_fault(NODE, *FAULT)
    try:
        rc, data, _ = _check(NODE)
        assert rc == 1
        assert data["failed"] is True
        # drained now, or already by slurmd's own run of the check a moment ago
        assert data["slurm"]["action"] in ("drain", "none"), data["slurm"]
        reason = _drained().get(NODE, "")
        assert reason.startswith("gpuctl node-check: gpu.pcie.width "), reason
    finally:
        lab.clear_faults(NODE)
    rc, data, _ = _check(NODE)
    assert rc == 0, data["report"]["nodes"][0]["checks"]
    assert data["slurm"]["action"] in ("resume", "none"), data["slurm"]
    assert NODE not in _drained()


def test_a_node_an_operator_drained_stays_drained(health_lab: Path) -> None:
    node = "gpu001"
    _on("ctl01", f"scontrol update nodename={node} state=drain reason=maintenance")
    try:
        rc, data, _ = _check(node)
        assert rc == 0
        assert data["slurm"]["action"] == "none"
        assert "not drained by gpuctl node-check (maintenance)" in data["slurm"]["detail"]
        assert _drained().get(node) == "maintenance"
    finally:
        _on("ctl01", f"scontrol update nodename={node} state=resume")


def test_slurmd_runs_the_check_and_drains_within_the_interval(health_lab: Path) -> None:
    lab.inject_fault(NODE, *FAULT)
    try:
        took = _wait_for(
            f"slurmd's health check drains {NODE}",
            lambda: _drained().get(NODE, "").startswith("gpuctl node-check: gpu.pcie.width"),
            2 * INTERVAL_S + 30,
        )
        print(f"slurmd drained {NODE} {took:.0f} s after the fault (interval {INTERVAL_S} s)")
    finally:
        lab.clear_faults(NODE)
    took = _wait_for(
        f"slurmd's health check resumes {NODE}",
        lambda: NODE not in _drained(),
        2 * INTERVAL_S + 30,
    )
    print(f"slurmd resumed {NODE} {took:.0f} s after clearing (interval {INTERVAL_S} s)")
