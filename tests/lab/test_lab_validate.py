"""End to end in the lab: `gpuctl validate` of a provisioned lab, as an operator runs it.

Real SSH (paramiko, host keys checked against the lab's known_hosts), real systemd, journald
and Slurm in the nodes; the GPU and InfiniBand tools are the lab's stand-ins (simulated
hardware). The lab is the shared provisioned lab of tests/lab/conftest.py (three compute
nodes, provisioned once for every test that needs it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_helpers import COMPUTE, NODES, ProvisionedLab, sh

from gpuctl.config import load_cluster
from gpuctl.lab import lab
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.probes import phases, probes_for

pytestmark = [pytest.mark.lab, pytest.mark.slow]

GPUCTL = str(Path(sys.executable).parent / "gpuctl")
GPUS = COMPUTE
LOST_GPU_PCI = "0000:5d:00"  # GPU 3 of the hgx-h100-ndr profile


@pytest.fixture
def cluster(provisioned_lab: ProvisionedLab) -> Path:
    return provisioned_lab.cluster


def _validate(cluster: Path, tmp: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """`gpuctl validate CLUSTER --json ARGS` -> (exit code, report, stderr)."""
    out = tmp / f"bundle-{len(list(tmp.glob('bundle-*')))}"
    res = subprocess.run(
        [GPUCTL, "validate", str(cluster), "--json", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return res.returncode, json.loads(res.stdout), res.stderr


def _bad(report: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Node -> (check, message) of every check that is not ok or warn."""
    return {
        n["node"]: [
            (c["check"], c["message"]) for c in n["checks"] if c["verdict"] in ("fail", "unknown")
        ]
        for n in report["nodes"]
    }


def _checks(report: dict[str, Any], node: str, check: str) -> list[dict[str, Any]]:
    n = next(n for n in report["nodes"] if n["node"] == node)
    return [c for c in n["checks"] if c["check"] == check]


def _ctl(command: str) -> str:
    res = sh(lab.address_of("ctl01"), command)
    assert res.returncode == 0, res.stderr
    return str(res.stdout)


def _drain_reasons() -> dict[str, str]:
    out = _ctl('sinfo -R -h -N -o "%N|%E"')
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def test_quick_passes_with_zero_failed_checks(cluster: Path, tmp_path: Path) -> None:
    code, report, err = _validate(cluster, tmp_path, "--level", "quick")
    assert code == 0, (_bad(report), err[-2000:])
    assert _bad(report) == {n: [] for n in NODES}
    assert report["level"] == "quick"
    for node in GPUS:
        assert [c["verdict"] for c in _checks(report, node, "gpu.count")] == ["ok"]
        assert len(_checks(report, node, "ib.port.state")) == 8
        assert [c["verdict"] for c in _checks(report, node, "fabricmanager.active")] == ["ok"]
        assert [c["verdict"] for c in _checks(report, node, "xid")] == ["ok"]
        assert _checks(report, node, "nccl.busbw") == []  # not at quick


def test_standard_passes_with_nccl_dcgm_and_ib_write_bw(cluster: Path, tmp_path: Path) -> None:
    """Every check of standard passes on the healthy lab; among them issue 18's point 6 on real
    tools (nothing simulated): `slurmd -C` of the installed Slurm against the NodeName line
    gpuctl wrote, `df` of the mounts the lab's cluster.yml requires (/ with 1 GiB free, /tmp a
    tmpfs)."""
    code, report, err = _validate(cluster, tmp_path, "--level", "standard")
    assert code == 0, (_bad(report), err[-2000:])
    assert _bad(report) == {n: [] for n in NODES}
    for node in GPUS:
        assert [c["verdict"] for c in _checks(report, node, "nccl.busbw")] == ["ok"]
        bw = _checks(report, node, "ib.write_bw")
        assert [c["subject"] for c in bw] == [f"mlx5_{i}" for i in range(8)]
        assert all(c["verdict"] == "ok" and c["measured"] > 375 for c in bw), bw
        assert _checks(report, node, "dcgm.diag")
        assert all(c["verdict"] == "ok" for c in _checks(report, node, "dcgm.diag"))
    _node_basics_pass(report)


def _node_basics_pass(report: dict[str, Any]) -> None:
    for node in GPUS:
        for check in ("node.cpus", "node.memory"):
            [found] = _checks(report, node, check)
            assert found["verdict"] in ("ok", "warn"), found  # warn: the host's CPU layout
        memory = _checks(report, node, "node.memory")[0]
        assert memory["verdict"] == "ok"
        assert memory["measured"] >= 1024
        assert [(c["subject"], c["verdict"]) for c in _checks(report, node, "node.mount")] == [
            ("/", "ok"),
            ("/tmp", "ok"),  # noqa: S108 - a mount point the lab requires
        ]
    assert _checks(report, "ctl01", "node.mount") == []  # the gpu group's mounts only


def test_node_basics_are_judged_with_the_real_slurmd_and_df(cluster: Path, tmp_path: Path) -> None:
    """Issue 18, point 6 (the healthy run: test_standard_passes_...): a /tmp unmounted on
    gpu002 (its files then land on the root file system, as when an NFS mount fails) fails
    gpu002 alone, at quick; a RealMemory above what the nodes have fails every compute node on
    node.memory."""
    unmount = sh(lab.address_of("gpu002"), "umount -l /tmp")  # lazily: a file may be open
    assert unmount.returncode == 0, unmount.stderr
    try:
        code, report, _ = _validate(cluster, tmp_path, "--level", "quick")
        assert code == 1
        assert _bad(report) == {
            **{n: [] for n in NODES if n != "gpu002"},
            "gpu002": [
                (
                    "node.mount",
                    "not mounted: /tmp is a directory on / (overlay), not a file system of its own",
                )
            ],
        }
    finally:
        remount = sh(
            lab.address_of("gpu002"), "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp"
        )
        assert remount.returncode == 0, remount.stderr
    doc = yaml.safe_load(cluster.read_text(encoding="utf-8"))
    doc["node_groups"][1]["memory_mb"] = 64 * 1024 * 1024  # 64 TiB
    more = tmp_path / "more-memory.yml"
    more.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    code, report, _ = _validate(more, tmp_path, "--level", "standard", "--limit", "gpu001")
    assert code == 1
    [memory] = _checks(report, "gpu001", "node.memory")
    assert memory["verdict"] == "fail"
    assert (
        "slurm.conf declares RealMemory=67108864: Slurm sets the node INVALID" in memory["message"]
    )
    code, report, _ = _validate(cluster, tmp_path, "--level", "quick")
    assert code == 0, _bad(report)


def test_a_lost_gpu_fails_and_drains_exactly_that_node_until_it_is_fixed(
    cluster: Path, tmp_path: Path
) -> None:
    lab.inject_fault("gpu002", "gpu_lost", "3")
    try:
        code, report, err = _validate(cluster, tmp_path, "--level", "quick", "--drain-failed")
        assert code == 1
        assert [n["node"] for n in report["nodes"] if n["failed"]] == ["gpu002"]
        count = _checks(report, "gpu002", "gpu.count")
        assert [(c["verdict"], c["measured"], c["expected"]) for c in count] == [("fail", 7, 8)]
        assert f"missing: {LOST_GPU_PCI}" in count[0]["message"]  # names the GPU
        reason = _drain_reasons()["gpu002"]
        assert reason.startswith(
            f"gpuctl: gpu.count 7 GPUs visible, expected 8, missing: {LOST_GPU_PCI}"
        )
        assert f"drained gpu002: {reason}" in err
        assert "gpu001" not in _drain_reasons()
    finally:
        lab.clear_faults("gpu002")
    # the remedy for Xid 79 is a reboot: the kernel log of the new boot is clean
    lab.reboot("gpu002")
    code, report, err = _validate(cluster, tmp_path, "--level", "quick", "--drain-failed")
    assert code == 0, (_bad(report), err[-2000:])
    assert "resumed gpu002" in err
    assert "gpu002" not in _drain_reasons()
    # back in service (after the reboot, until slurmd answers a ping again: `idle*`)
    deadline = time.monotonic() + 120
    while (state := _ctl("sinfo -h -n gpu002 -o %t").strip()) != "idle":
        assert time.monotonic() < deadline, state
        time.sleep(2)


def test_a_node_an_operator_drained_is_never_resumed(cluster: Path, tmp_path: Path) -> None:
    _ctl("scontrol update nodename=gpu001 state=drain reason=maintenance")
    try:
        code, report, err = _validate(cluster, tmp_path, "--level", "quick", "--drain-failed")
        assert code == 0, (_bad(report), err[-2000:])  # it passes, but is not gpuctl's
        assert _drain_reasons()["gpu001"] == "maintenance"
        assert "gpu001: left drained: drained by someone else (maintenance)" in err
    finally:
        _ctl("scontrol update nodename=gpu001 state=resume")


def test_a_host_key_that_differs_from_known_hosts_is_refused(cluster: Path, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"{lab.address_of('gpu001')} {lab.host_key('ctl01')}\n")  # not gpu001's
    text = cluster.read_text(encoding="utf-8")
    moved = tmp_path / "cluster.yml"
    moved.write_text(text.replace(str(lab.known_hosts()), str(known)), encoding="utf-8")
    assert str(known) in moved.read_text(encoding="utf-8")
    code, report, _ = _validate(moved, tmp_path, "--level", "quick", "--limit", "gpu001")
    assert code == 1
    reach = _checks(report, "gpu001", "node.reachable")
    assert "host key of 198.18.0.11 differs" in reach[0]["message"], reach


def test_a_powered_off_node_is_a_failed_node_unreachable(cluster: Path, tmp_path: Path) -> None:
    lab.stop_node("gpu002")
    try:
        code, report, err = _validate(cluster, tmp_path, "--level", "quick")
        assert code == 1
        assert [n["node"] for n in report["nodes"] if n["failed"]] == ["gpu002"]
        reach = _checks(report, "gpu002", "node.reachable")
        assert [c["verdict"] for c in reach] == ["fail"]
        assert reach[0]["message"].startswith("not checked: ssh: ")
        assert "unreachable: gpu002" in err
    finally:
        lab.start_node("gpu002")  # power it on again
        lab.wait_running("gpu002", lab.address_of("gpu002"))


def test_one_node_at_standard_is_measured_against_a_partner_outside_the_limit(
    cluster: Path, tmp_path: Path
) -> None:
    """`--limit gpu002 --level standard`: ib_write_bw of gpu002 with a node outside the limit
    that Slurm has in service (the partner is not judged; each verdict names it)."""
    code, report, err = _validate(cluster, tmp_path, "--level", "standard", "--limit", "gpu002")
    assert code == 0, (_bad(report), err[-2000:])
    assert [n["node"] for n in report["nodes"]] == ["gpu002"]
    bw = _checks(report, "gpu002", "ib.write_bw")
    assert [c["subject"] for c in bw] == [f"mlx5_{i}" for i in range(8)]
    assert all(c["verdict"] == "ok" and c["measured"] > 375 for c in bw), bw
    assert all("(with partner gpu001 (outside --limit))" in c["message"] for c in bw) or all(
        "(with partner gpu003 (outside --limit))" in c["message"] for c in bw
    ), bw


def _force_off(node: str) -> None:
    """Power the node off at once (the supervisor's SIGUSR2: its container's init killed with
    SIGKILL, as losing power would), and wait until it is off."""
    from gpuctl.lab import supervisor, system

    pid = supervisor.live_pid(system.run_dir() / f"{node}.pid")
    assert pid is not None, f"{node} is not running"
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while lab.node_running(node):
        assert time.monotonic() < deadline, f"{node} did not power off"
        time.sleep(0.2)


def _phase_one_done(bundle: Path, nodes: tuple[str, ...], exps: dict[str, NodeExpectation]) -> bool:
    """Every node's own probes are done (its meta.json no longer says 'not finished' of any but
    the second reads that follow ib_write_bw, the collector's last phase)."""
    for node in nodes:
        try:
            probes = json.loads((bundle / node / "meta.json").read_text(encoding="utf-8"))["probes"]
        except (OSError, ValueError, KeyError):
            return False
        after_pairs = {p.kind for p in phases(probes_for(exps[node], "standard"))[3]}
        pending = {k for k, v in probes.items() if "not finished" in str(v.get("error"))}
        if pending - after_pairs:
            return False
    return True


def test_a_node_that_loses_power_mid_run_is_lost_and_the_run_finishes_in_seconds(
    cluster: Path, tmp_path: Path
) -> None:
    """gpu002 loses power as the ib_write_bw pairs start: the run notices at once, fails it as
    lost (counted unreachable), pairs its peers again and never fails them for it."""
    out = tmp_path / "bundle-lost"
    stdout, stderr = tmp_path / "out.json", tmp_path / "err.txt"
    with stdout.open("w") as fo, stderr.open("w") as fe:
        proc = subprocess.Popen(
            [GPUCTL, "validate", str(cluster), "--json", "--out", str(out), "--level", "standard"],
            stdout=fo,
            stderr=fe,
        )
    try:
        deadline = time.monotonic() + 300
        exps = expectations(load_cluster(cluster))
        while not _phase_one_done(out, GPUS, exps):
            assert proc.poll() is None, stderr.read_text()[-2000:]
            assert time.monotonic() < deadline, "the nodes' own probes did not finish"
            time.sleep(0.2)
        _force_off("gpu002")
        cut = time.monotonic()
        code = proc.wait(timeout=300)
        assert time.monotonic() - cut < 90, "the run did not finish within 90 s of the loss"
        err = stderr.read_text()
        assert code == 1, err[-3000:]
        report = json.loads(stdout.read_text())
        assert [n["node"] for n in report["nodes"] if n["failed"]] == ["gpu002"], _bad(report)
        reach = _checks(report, "gpu002", "node.reachable")
        assert [c["verdict"] for c in reach] == ["fail"]
        assert "lost" in reach[0]["message"], reach
        assert "1 unreachable (1 lost during the run)" in err, err[-2000:]
        assert "lost: node gpu002" in err
        for node in ("gpu001", "gpu003"):  # its peers: paired again, never failed for it
            bw = _checks(report, node, "ib.write_bw")
            assert [c["verdict"] for c in bw] == ["ok"] * 8, bw
        header = json.loads((out / "bundle.json").read_text())
        assert list(header["lost"]) == ["gpu002"]
    finally:
        if proc.poll() is None:
            proc.kill()
        lab.start_node("gpu002")  # power it on again
        lab.wait_running("gpu002", lab.address_of("gpu002"))
        # back in service for the tests after this one (slurmd registers again; a node that
        # Slurm saw go away unexpectedly is resumed)
        deadline = time.monotonic() + 120
        while (state := _ctl("sinfo -h -n gpu002 -o %t").strip()) != "idle":
            if state.startswith("down") and "*" not in state:
                _ctl("scontrol update nodename=gpu002 state=resume")
            assert time.monotonic() < deadline, state
            time.sleep(2)
