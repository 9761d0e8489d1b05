"""Host <-> GPU copy bandwidth (gpuctl issue 18, point 3; issue 17: pcie_h2d_gbs and pcie_d2h_gbs
were refused as "not enforced yet"): nvbandwidth's host_to_device_memcpy_ce and
device_to_host_memcpy_ce on every GPU node at standard and long, the nvbandwidth DCGM 4 ships,
judged per GPU (checks ``pcie.h2d``, ``pcie.d2h``) against the model's floors.

Real captures: tests/fixtures/nvbandwidth/ (4x T4 v0.8, 8x RTX 4090 v0.2, 8x RTX 5090, A100).
The lab's stand-in prints v0.8's layout; checked here line by line against the real v0.8 file.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from test_collect import PROFILE, FakeConnector, Sim, fault

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.lab.sim import nvbandwidth as sim_nvbandwidth
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.lab.sim.faults import FaultError, apply
from gpuctl.validation.api import validate
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations, nvbandwidth_cuda
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.pcie import judge_pcie_copies
from gpuctl.validation.parsing import parse
from gpuctl.validation.probes import collects, probes_for
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "nvbandwidth"
T4_H2D = FIX / "nvbandwidth-t4-4gpu-v0.8-h2d-prefix.txt"
RTX4090 = FIX / "nvbandwidth-rtx4090-8gpu-v0.2-full-run-h2d-d2h-partial.txt"  # Gen4, 8 GPUs
RTX5090 = FIX / "nvbandwidth-rtx5090-8gpu-unknown-version-h2d-d2h-partial.txt"  # Gen5, 8 GPUs
A100_CLUSTER = ROOT / "inventories" / "a100-roce.yml"  # gpu[001-004]: 8x A100-SXM4-80GB (Gen4)
H2D_TEXT = "host_to_device_memcpy_ce"


def _a100(**thresholds: Any) -> Any:
    cluster = load_cluster_text(A100_CLUSTER.read_text(encoding="utf-8"), "cluster.yml")
    exp = expectations(cluster)["gpu001"]
    return dataclasses.replace(exp, thresholds={**exp.thresholds, **thresholds})


def _judge(exp: Any, text: str, rc: int | None = 0) -> list[CheckResult]:
    return judge_pcie_copies(exp, {"nvbandwidth": ProbeOutput("nvbandwidth", text, rc=rc)})


def _by(results: list[CheckResult], check: str) -> dict[str, CheckResult]:
    """The results of one check by subject: a GPU, or "" for one about the whole run."""
    return {r.subject or "": r for r in results if r.check == check}


# ------------------------------------------------------------------------------------------
# The probe: where it runs, what it runs


def test_every_gpu_node_runs_the_dcgm_nvbandwidth_at_standard_and_long() -> None:
    cluster = load_cluster_text(A100_CLUSTER.read_text(encoding="utf-8"), "cluster.yml")
    exps = expectations(cluster)
    gpu = exps["gpu001"]
    assert gpu.nvbandwidth_cuda == "12"
    assert not collects(gpu, "nvbandwidth", "quick")
    for level in ("standard", "long"):
        probe = next(p for p in probes_for(gpu, level) if p.kind == "nvbandwidth")
        assert probe.exclusive
        assert probe.timeout_s == 60
        assert probe.command(gpu) == (
            "/usr/libexec/datacenter-gpu-manager-4/plugins/cuda12/nvbandwidth",
            "-t",
            "host_to_device_memcpy_ce",
            "-t",
            "device_to_host_memcpy_ce",
        )
    cpu_only = [e for e in exps.values() if not e.gpu_count]
    assert cpu_only
    assert not any(collects(e, "nvbandwidth", "standard") for e in cpu_only)


def test_only_dcgm_4_ships_nvbandwidth_and_the_package_follows_cuda() -> None:
    assert nvbandwidth_cuda("4.2.3", "12.8") == "12"
    assert nvbandwidth_cuda("4.4.1", "13.0") == "13"
    assert nvbandwidth_cuda("3.3.9", "12.8") is None


# ------------------------------------------------------------------------------------------
# The judge, on real captures


def test_a_real_8_gpu_gen4_run_is_judged_per_gpu_against_the_a100_floors() -> None:
    results = _judge(_a100(), capture_output(RTX4090))
    h2d, d2h = _by(results, "pcie.h2d"), _by(results, "pcie.d2h")
    assert sorted(h2d) == [f"GPU{i}" for i in range(8)] == sorted(d2h)
    # the A100's Gen4 floor 24 GB/s (Azure): GPU2 copies 23.90 in, every GPU >= 26.25 out
    assert {s for s, r in h2d.items() if r.verdict is Verdict.FAIL} == {"GPU2"}
    assert "23.9 GB/s < 24" in h2d["GPU2"].message
    assert h2d["GPU2"].limit == 31.504  # PCIe Gen4 x16, per direction (data/limits.yml)
    assert all(r.verdict is Verdict.OK for r in d2h.values())
    assert h2d["GPU0"].source
    assert "gpu model a100-sxm4-80gb" in h2d["GPU0"].source


def test_a_copy_above_what_the_link_carries_is_not_a_measurement() -> None:
    # eight GPUs at 56-57 GB/s are real on Gen5 (RTX 5090), impossible on the A100's Gen4 link
    results = _judge(_a100(), capture_output(RTX5090))
    for check in ("pcie.h2d", "pcie.d2h"):
        verdicts = {r.verdict for r in _by(results, check).values()}
        assert verdicts == {Verdict.FAIL}, check
    assert "more than PCIe Gen4 x16" in _by(results, "pcie.h2d")["GPU0"].message


def test_fewer_gpus_measured_than_the_node_has_is_unknown_for_the_missing_ones() -> None:
    results = _judge(_a100(pcie_h2d_gbs=12.0), capture_output(T4_H2D))
    h2d = _by(results, "pcie.h2d")
    assert {s: r.verdict for s, r in h2d.items()} == {
        **{f"GPU{i}": Verdict.OK for i in range(4)},
        **{f"GPU{i}": Verdict.UNKNOWN for i in range(4, 8)},
    }
    # the capture ran the host -> GPU prefix only: GPU -> host was never measured
    (d2h,) = _by(results, "pcie.d2h").values()
    assert d2h.verdict is Verdict.UNKNOWN
    assert "device_to_host_memcpy_ce not in the output" in d2h.message


def _edit_first_row(text: str, new: str) -> str:
    return re.sub(r"(?m)^ 0     12\.35     12\.34", new, text, count=1)


def test_na_a_failed_testcase_and_a_corrupted_copy_never_pass() -> None:
    text = capture_output(T4_H2D)
    exp = dataclasses.replace(_a100(pcie_h2d_gbs=12.0), gpu_count=4)
    na = _by(_judge(exp, _edit_first_row(text, " 0       N/A     12.34")), "pcie.h2d")
    assert na["GPU0"].verdict is Verdict.UNKNOWN
    assert na["GPU1"].verdict is Verdict.OK
    failed = text.replace(
        "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n",
        "Error: CUDA_ERROR_OUT_OF_MEMORY\n",
        1,
    )
    (err,) = _by(_judge(exp, failed), "pcie.h2d").values()
    assert err.verdict is Verdict.FAIL
    assert "CUDA_ERROR_OUT_OF_MEMORY" in err.message
    stopped = text.split("SUM host_to_device_memcpy_ce")[0].replace(
        " 0     12.35", "Invalid value when checking the pattern at 0x7f\n 0     12.35"
    )
    (bad,) = _by(_judge(exp, stopped), "pcie.h2d").values()
    assert bad.verdict is Verdict.FAIL
    assert "did not match its pattern" in bad.message
    # exit 127 (DCGM 4's CUDA package missing) or a timeout: UNKNOWN, never OK
    (gone,) = _by(_judge(exp, "sh: 1: nvbandwidth: not found\n", rc=127), "pcie.h2d").values()
    assert gone.verdict is Verdict.UNKNOWN


def test_a_model_without_a_floor_is_unknown_and_names_the_key() -> None:
    results = _judge(_a100(pcie_h2d_gbs=None), capture_output(RTX4090))
    assert {r.verdict for r in _by(results, "pcie.h2d").values()} == {Verdict.UNKNOWN}
    assert "set validation.thresholds.pcie_h2d_gbs" in _by(results, "pcie.h2d")["GPU0"].message


# ------------------------------------------------------------------------------------------
# The lab's stand-in


def test_the_stand_in_prints_the_layout_of_the_real_v0_8_capture() -> None:
    real = capture_output(T4_H2D).splitlines()
    sim = sim_nvbandwidth.output(PROFILE, {}, "gpu001", [H2D_TEXT]).splitlines()
    start_real, start_sim = real.index(f"Running {H2D_TEXT}."), sim.index(f"Running {H2D_TEXT}.")

    def keys(lines: list[str]) -> list[str]:
        # each header line by what it is ("Key:" lines by their key), one entry for the devices
        out: list[str] = []
        for ln in lines:
            key = "devices" if ln.startswith("Device ") else ln.split(":")[0] if ":" in ln else ln
            key = "host" if key not in ("", "devices") and ":" not in ln else key
            if not (out and out[-1] == key == "devices"):
                out.append(key)
        return out

    assert keys(sim[:start_sim]) == keys(real[:start_real])
    assert sim[0] == real[0] == "nvbandwidth Version: v0.8"
    # the testcase block: the same lines, column for column (widths from inline_common.h)
    block = real[start_real : real.index(f"SUM {H2D_TEXT} 49.32") + 2]
    mine = sim[start_sim : start_sim + len(block)]
    assert mine[:2] == block[:2]
    assert re.fullmatch(r"  (\s{9}\d){8}", mine[2])
    assert re.fullmatch(r"  (\s{9}\d){4}", block[2])
    cells = [mine[3][2 + 10 * i : 12 + 10 * i] for i in range(8)]
    assert mine[3][:2] == block[3][:2] == " 0"
    assert all(re.fullmatch(r"\s+\d+\.\d\d", c) for c in cells), cells
    assert mine[4] == block[4] == ""
    assert re.fullmatch(rf"SUM {H2D_TEXT} \d+\.\d\d", mine[5])
    assert sim[-3:] == real[-3:]  # the NOTE block and its blank line
    parsed = parse("nvbandwidth", "\n".join(sim) + "\n")
    assert parsed.recognised
    assert not parsed.problems
    devices = parsed.data["devices"]
    assert [d["bus_id"] for d in devices] == [
        b.split(".")[0].lower() for b in PROFILE["gpus"]["bus_ids"]
    ]


def test_the_stand_in_copies_what_real_links_copy_and_the_faults_slow_one_gpu() -> None:
    def per_gpu(faults: dict[str, Any], profile: dict[str, Any] = PROFILE) -> list[float]:
        text = sim_nvbandwidth.output(profile, faults, "gpu001", [H2D_TEXT])
        values: list[float] = parse("nvbandwidth", text).data["testcases"][0]["rows"][0]["values"]
        return values

    healthy = per_gpu({})
    assert all(56.3 <= v <= 56.4 for v in healthy), healthy  # Gen5 x16 (RTX 5090 capture)
    slow = per_gpu(apply({}, "pcie_copy_slow", "2"))
    assert slow[2] == pytest.approx(healthy[2] / 2, abs=0.05)
    assert slow[:2] + slow[3:] == healthy[:2] + healthy[3:]
    narrow = per_gpu(apply({}, "pcie_degraded", "5:8"))  # the link trained to x8
    assert narrow[5] == pytest.approx(healthy[5] / 2, abs=0.05)
    a100 = json.loads(sim_profiles.profile_json("a100-hdr"))
    assert all(25.0 <= v <= 25.2 for v in per_gpu({}, a100))  # Gen4 x16 (A100 capture)
    with pytest.raises(FaultError):
        apply({}, "pcie_copy_slow", "2:1.5")
    with pytest.raises(sim_nvbandwidth.NvbandwidthError):
        sim_nvbandwidth.main(PROFILE, {}, "gpu001", [])  # a full run is not simulated


# ------------------------------------------------------------------------------------------
# Whole runs against simulated nodes


def _failed(res: Any) -> dict[str, list[str]]:
    return {n.node: sorted({c.check for c in n.problems()}) for n in res.report.nodes if n.failed}


def test_a_healthy_standard_run_passes_every_gpu_both_ways(cluster_yml: Path) -> None:
    res = validate(
        load_cluster(cluster_yml),
        level="standard",
        out=cluster_yml.parent / "b",
        connector=FakeConnector(Sim()),
    )
    assert not res.failed, _failed(res)
    for node in ("gpu001", "gpu002", "gpu003"):
        report = next(n for n in res.report.nodes if n.node == node)
        for check in ("pcie.h2d", "pcie.d2h"):
            got = [c for c in report.checks if c.check == check]
            assert len(got) == 8, (node, check)
            assert {c.verdict for c in got} == {Verdict.OK}, (node, check)


def test_one_gpu_with_slow_copies_fails_its_node_alone_naming_the_gpu(cluster_yml: Path) -> None:
    sim = Sim({"gpu002": fault("pcie_copy_slow", "2")})
    res = validate(
        load_cluster(cluster_yml),
        level="standard",
        out=cluster_yml.parent / "b",
        connector=FakeConnector(sim),
    )
    assert _failed(res) == {"gpu002": ["pcie.d2h", "pcie.h2d"]}
    report = next(n for n in res.report.nodes if n.node == "gpu002")
    bad = {(c.check, c.subject) for c in report.checks if c.verdict is Verdict.FAIL}
    assert bad == {("pcie.h2d", "GPU2"), ("pcie.d2h", "GPU2")}
    msg = next(c.message for c in report.checks if c.check == "pcie.h2d" and c.subject == "GPU2")
    assert "< 48" in msg
    assert "00000000:3a:00" in msg


def test_the_lab_package_puts_the_stand_in_where_the_probe_looks() -> None:
    from gpuctl.lab import repo
    from gpuctl.validation.probes import NVBANDWIDTH

    specs = {s.name: s for s in repo.load_specs() if s.default}
    assert NVBANDWIDTH.format(cuda="12") in specs["datacenter-gpu-manager-4-cuda12"].bin
