"""Which side of a failed ib_write_bw pair is to blame, and the causes gpuctl names
(gpuctl/validation/judges/blame.py, docs/validate.md "Which side of a failed pair is to blame").

Before blame.py, a pair result was charged to both nodes: with two compute nodes one node's bad
port (its own ibstat says Down) failed and drained the healthy partner too. Fabric Manager of
another version than the driver failed the GPUs' fabric state with no check naming the cause.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.lab.sim import fabric, profiles
from gpuctl.lab.sim.faults import apply
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.blame import Peer, assign_blame, pair_peers
from gpuctl.validation.judges.fabric_manager import judge_fabric_manager
from gpuctl.validation.results import CheckResult, NodeReport, Verdict


def _bw(node: str, hca: str, measured: float, verdict: Verdict = Verdict.FAIL) -> CheckResult:
    sign = "<" if verdict is Verdict.FAIL else ">="
    return CheckResult(
        "ib.write_bw",
        node,
        verdict,
        f"{measured:g} Gb/s {sign} 360 Gb/s",
        subject=hca,
        measured=measured,
        expected=360.0,
        unit="Gb/s",
    )


def _state(node: str, hca: str, ok: bool = True) -> CheckResult:
    if ok:
        return CheckResult("ib.port.state", node, Verdict.OK, "Active, LinkUp", subject=f"{hca}/1")
    return CheckResult(
        "ib.port.state",
        node,
        Verdict.FAIL,
        "state Down, physical state Disabled; expected Active, LinkUp",
        subject=f"{hca}/1",
        measured="Down/Disabled",
        expected="Active/LinkUp",
    )


def _judged(per_node: dict[str, list[CheckResult]]) -> dict[str, NodeReport]:
    # the wiring the lead adds to suite.judge_cluster after the fleet step, locally
    return {n: NodeReport(n, tuple(rs)) for n, rs in per_node.items()}


def _pair(a: str, b: str, hca: str = "mlx5_0") -> dict[str, dict[str, Peer]]:
    return {a: {hca: Peer(b, hca)}, b: {hca: Peer(a, hca)}}


def test_a_partner_whose_own_port_is_down_takes_the_blame() -> None:
    # two compute nodes: gpu002's mlx5_0 is Down (its own ibstat says so); both pair results fail
    per_node = {
        "gpu001": [_state("gpu001", "mlx5_0"), _bw("gpu001", "mlx5_0", 12.0)],
        "gpu002": [_state("gpu002", "mlx5_0", ok=False), _bw("gpu002", "mlx5_0", 12.0)],
    }
    assign_blame(per_node, _pair("gpu001", "gpu002"))
    reports = _judged(per_node)
    assert not reports["gpu001"].failed  # the healthy partner is not failed, not drained
    assert reports["gpu002"].failed
    [healthy] = [r for r in per_node["gpu001"] if r.check == "ib.write_bw"]
    assert healthy.verdict is Verdict.WARN
    assert "pair with gpu002 failed; gpu002's ib.port.state mlx5_0/1: state Down" in (
        healthy.message
    )
    assert "(gpu002's own evidence): not charged to gpu001" in healthy.message
    assert healthy.message.endswith("(with gpu002 mlx5_0)")
    [faulty] = [r for r in per_node["gpu002"] if r.check == "ib.write_bw"]
    assert faulty.verdict is Verdict.FAIL
    assert "partner: gpu001 mlx5_0" in faulty.evidence


def test_without_evidence_two_nodes_are_warned_not_drained() -> None:
    per_node = {
        "gpu001": [_state("gpu001", "mlx5_0"), _bw("gpu001", "mlx5_0", 100.0)],
        "gpu002": [_state("gpu002", "mlx5_0"), _bw("gpu002", "mlx5_0", 100.0)],
    }
    assign_blame(per_node, _pair("gpu001", "gpu002"))
    for node, results in per_node.items():
        [r] = [r for r in results if r.check == "ib.write_bw"]
        assert r.verdict is Verdict.WARN, node
        assert "which side is at fault cannot be decided" in r.message
        assert "run again with a third node" in r.message
    assert not any(rep.failed for rep in _judged(per_node).values())


def test_the_node_that_failed_with_every_partner_keeps_its_fail() -> None:
    # three nodes after the retests: gpu001 failed with gpu003 (its last recorded pair);
    # gpu003 passed with gpu002: gpu001 is the common factor, no self-evidence needed
    per_node = {
        "gpu001": [_bw("gpu001", "mlx5_0", 100.0)],
        "gpu002": [_bw("gpu002", "mlx5_0", 390.0, Verdict.OK)],
        "gpu003": [_bw("gpu003", "mlx5_0", 390.0, Verdict.OK)],
    }
    peers = {
        "gpu001": {"mlx5_0": Peer("gpu003", "mlx5_0")},
        "gpu002": {"mlx5_0": Peer("gpu003", "mlx5_0")},
        "gpu003": {"mlx5_0": Peer("gpu002", "mlx5_0")},
    }
    assign_blame(per_node, peers)
    [r] = per_node["gpu001"]
    assert r.verdict is Verdict.FAIL
    assert r.message == "100 Gb/s < 360 Gb/s (with gpu003 mlx5_0)"


def test_a_node_that_passed_with_another_partner_is_warned() -> None:
    per_node = {
        "gpu001": [_bw("gpu001", "mlx5_0", 100.0), _bw("gpu001", "mlx5_1", 390.0, Verdict.OK)],
        "gpu002": [_bw("gpu002", "mlx5_0", 100.0)],
        "gpu003": [],
    }
    peers = {
        "gpu001": {"mlx5_0": Peer("gpu002", "mlx5_0"), "mlx5_1": Peer("gpu003", "mlx5_1")},
        "gpu002": {"mlx5_0": Peer("gpu001", "mlx5_0")},
    }
    assign_blame(per_node, peers)
    [bad] = [r for r in per_node["gpu001"] if r.subject == "mlx5_0"]
    assert bad.verdict is Verdict.WARN
    assert "gpu001 passed with gpu003: gpu002 is the suspect" in bad.message
    assert per_node["gpu002"][0].verdict is Verdict.FAIL


def test_a_partner_outside_the_run_or_no_partner_leaves_the_fail() -> None:
    # a known-good partner outside --limit is not judged here: the result is the node's own
    per_node = {"gpu001": [_bw("gpu001", "mlx5_0", 100.0)]}
    assign_blame(per_node, {"gpu001": {"mlx5_0": Peer("gpu009", "mlx5_0")}})
    assert per_node["gpu001"][0].verdict is Verdict.FAIL
    alone = {"gpu001": [_bw("gpu001", "mlx5_0", 100.0)]}
    assign_blame(alone, {})
    assert alone["gpu001"][0] == _bw("gpu001", "mlx5_0", 100.0)


def test_the_fleet_result_of_a_blamed_pair_follows_it() -> None:
    fleet = CheckResult(
        "ib.write_bw.fleet", "gpu001", Verdict.FAIL, "12 is below 0.95 x fleet median 390",
        subject="mlx5_0", measured=12.0, expected=370.5,
    )  # fmt: skip
    per_node = {
        "gpu001": [_bw("gpu001", "mlx5_0", 12.0), fleet],
        "gpu002": [_state("gpu002", "mlx5_0", ok=False), _bw("gpu002", "mlx5_0", 12.0)],
    }
    assign_blame(per_node, _pair("gpu001", "gpu002"))
    assert [r.verdict for r in per_node["gpu001"]] == [Verdict.WARN, Verdict.WARN]


def test_pair_peers_reads_what_the_collector_records(tmp_path: Path) -> None:
    (tmp_path / "gpu001").mkdir()
    record = {"rc": 0, "role": "client", "peer": "gpu002", "peer_hca": "mlx5_3", "retest": False}
    meta = {"probes": {"perftest-mlx5_0": record, "ibstat": {"rc": 0}}}
    (tmp_path / "gpu001" / "meta.json").write_text(json.dumps(meta))
    assert pair_peers(tmp_path, ["gpu001", "gpu002"]) == {
        "gpu001": {"mlx5_0": Peer("gpu002", "mlx5_3")}
    }


# ------------------------------------------------------------------------------------------
# Fabric Manager of another version than the driver: named, and named as the cause

# akash-network/website, provider FAQ "nvidia-fabricmanager package version mismatch" (as the
# page shows `systemctl status nvidia-fabricmanager`; the same line in NVIDIA/gpu-operator#544)
MISMATCH = """\
Nov 05 13:55:26 node1 systemd[1]: Starting NVIDIA fabric manager service...
Nov 05 13:55:26 node1 nv-fabricmanager[104230]: fabric manager NVIDIA GPU driver interface \
version 550.127.05 don't match with driver version 550.120. Please update with matching \
NVIDIA driver package.
Nov 05 13:55:26 node1 systemd[1]: nvidia-fabricmanager.service: Control process exited, \
code=exited, status=1/FAILURE
"""


def test_fabric_manager_of_another_version_names_both_and_the_remedy() -> None:
    exp = expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]
    res = judge_fabric_manager(exp, {"fabricmanager": ProbeOutput("fabricmanager", MISMATCH)})
    [version] = [r for r in res if r.check == "fabricmanager.version"]
    assert version.verdict is Verdict.FAIL
    assert version.message == (
        "Fabric Manager 550.127.05 refuses to start with driver 550.120: install the matching "
        "nvidia-fabricmanager (550.120)"
    )
    assert (version.measured, version.expected) == ("550.127.05", "550.120")


def test_the_fabric_state_failure_says_its_cause() -> None:
    exp = expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]
    results = judge_fabric_manager(exp, {"fabricmanager": ProbeOutput("fabricmanager", MISMATCH)})
    fabric_state = CheckResult(
        "gpu.fabric", "gpu001", Verdict.FAIL, "fabric state In Progress, status N/A",
        subject="GPU0",
    )  # fmt: skip
    per_node = {"gpu001": [fabric_state, *results]}
    assign_blame(per_node, {})
    [gpu] = [r for r in per_node["gpu001"] if r.check == "gpu.fabric"]
    assert gpu.message == (
        "fabric state In Progress, status N/A; cause: Fabric Manager 550.127.05 refuses to "
        "start with driver 550.120: install the matching nvidia-fabricmanager (550.120) "
        "(fabricmanager.version)"
    )


def test_the_stand_in_prints_the_real_mismatch_line_and_the_check_fails() -> None:
    profile = profiles.load("hgx-h100-ndr")
    faults = apply({}, "fabricmanager_version", "535.104.05")
    text, status = fabric.systemctl_status(profile, faults, "gpu001")
    assert status == 3
    driver = profile["driver_version"]
    line = (
        "fabric manager NVIDIA GPU driver interface version 535.104.05 don't match with "
        f"driver version {driver}. Please update with matching NVIDIA driver package."
    )
    assert "nv-fabricmanager[" in text
    assert line in text
    exp = expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]
    res = judge_fabric_manager(exp, {"fabricmanager": ProbeOutput("fabricmanager", text, rc=3)})
    [version] = [r for r in res if r.check == "fabricmanager.version"]
    assert version.verdict is Verdict.FAIL
    assert version.message.startswith(
        f"Fabric Manager 535.104.05 refuses to start with driver {driver}: install"
    )
