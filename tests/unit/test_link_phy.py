"""Each adapter port's physical layer (gpuctl issue 18, point 1): `mlxlink -d <hca> -m -c`
after the level's tests, judged by gpuctl/validation/judges/phy.py (ib.link.ber against
data/counters.yml's 1E-12, mlxlink's own troubleshooting, ib.link.module against the
transceiver's own alarm thresholds).

Readings: the real full `-m -c` captures of a BlueField-3 port (passive DAC, every BER
15E-255), the real OSFP Module Info capture, the same with one value changed as a failing port
would show it; then the lab's simulator with the `ib_ber` fault on one HCA of one node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import ROOT
from test_collect import fails_only, fault

from gpuctl.config import load_cluster
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.phy import judge_link_phy
from gpuctl.validation.probes import probes_for
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "ib"
FULL = capture_output(FIX / "mlxlink-m-c-bluefield3-qsfp28-passive-dac-no-ddm.txt")
PEER = capture_output(FIX / "counters/mlxlink-c-bluefield3-port2-qsfp28-dac-loopback-peer-end.txt")
OSFP = capture_output(FIX / "mlxlink-module-info-osfp-excerpt.txt")


def _set(text: str, label: str, value: str) -> str:
    changed, n = re.subn(
        rf"^({re.escape(label)}\s*: ).*$", rf"\g<1>{value}", text, count=1, flags=re.M
    )
    assert n == 1, label
    return changed


def _judge(cluster_yml: Path, odd: str, text: str, rc: int = 0) -> dict[str, CheckResult]:
    """gpuctl001's HCAs all read the healthy capture but ``odd``, which reads ``text``; the
    results of ``odd`` by check."""
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    outputs = {
        f"mlxlink.{n.device}": ProbeOutput("mlxlink", text if n.device == odd else FULL, rc)
        for n in exp.nics
    }
    results = judge_link_phy(exp, outputs)
    assert {r.subject for r in results} == {n.device for n in exp.nics}
    return {r.check: r for r in results if r.subject == odd}


def test_a_port_without_errors_passes(cluster_yml: Path) -> None:
    found = _judge(cluster_yml, "mlx5_3", PEER)
    ber, module = found["ib.link.ber"], found["ib.link.module"]
    assert ber.verdict is Verdict.OK
    assert ber.message == (
        "Effective BER 1.5E-254 (raw 1.5E-254, before FEC) over 25075.2 min since the counters "
        "were cleared, within 1.0E-12"
    )
    assert (ber.measured, ber.expected) == (1.5e-254, 1e-12)
    assert "DGX SuperPOD" in str(ber.source)
    assert module.verdict is Verdict.OK
    assert (
        module.message == "QSFP28: no diagnostics with alarm thresholds (a passive cable has none)"
    )


def test_a_bit_error_rate_above_1e_12_after_fec_fails(cluster_yml: Path) -> None:
    bad = _set(FULL, "Effective Physical BER", "3E-11")
    [ber] = [r for r in _judge(cluster_yml, "mlx5_0", bad).values() if r.check == "ib.link.ber"]
    assert ber.verdict is Verdict.FAIL
    assert ber.message.startswith("Effective BER 3.0E-11")
    assert ber.message.endswith("above 1.0E-12")
    # the raw rate before FEC is shown, never judged: FEC exists to correct it
    noisy = _set(FULL, "Raw Physical BER", "1E-5")
    assert _judge(cluster_yml, "mlx5_0", noisy)["ib.link.ber"].verdict is Verdict.OK


def test_symbol_ber_is_judged_where_mlxlink_shows_it(cluster_yml: Path) -> None:
    """InfiniBand HDR/NDR: the symbol BER (after FEC and PLR) is what applications see."""
    ib = FULL.replace(
        "Effective Physical Errors          : 0\n",
        "Symbol Errors                      : 12\nSymbol BER                         : 2E-10\n"
        "Effective Physical Errors          : 0\n",
    )
    ber = _judge(cluster_yml, "mlx5_1", ib)["ib.link.ber"]
    assert ber.verdict is Verdict.FAIL
    assert ber.message.startswith("Symbol BER 2.0E-10")
    clean = ib.replace("2E-10", "15E-255")
    assert _judge(cluster_yml, "mlx5_1", clean)["ib.link.ber"].verdict is Verdict.OK


def test_mlxlinks_own_troubleshooting_warns(cluster_yml: Path) -> None:
    text = _set(_set(FULL, "Status Opcode", "25"), "Recommendation", "Cable speed not enabled")
    ber = _judge(cluster_yml, "mlx5_2", text)["ib.link.ber"]
    assert ber.verdict is Verdict.WARN
    assert ber.message.endswith("mlxlink Status Opcode 25: Cable speed not enabled")


def test_a_transceiver_reading_outside_its_own_thresholds_fails(cluster_yml: Path) -> None:
    module_only = OSFP
    ok = _judge(cluster_yml, "mlx5_4", FULL.replace("Module Info\n", "Old\n") + "\n" + module_only)
    assert ok["ib.link.module"].verdict is Verdict.OK
    assert ok["ib.link.module"].message == (
        "OSFP: temperature (C), voltage (mV), bias current (mA), Rx power (dBm), Tx power (dBm) "
        "within the module's thresholds"
    )
    hot = _set(OSFP, "Temperature [C]", "81 [-5..75]")
    dark = _set(hot, "Rx Power Current [dBm]", "1.886,-14.2,2.281,1.976 [-10.41..6]")
    bad = _judge(cluster_yml, "mlx5_4", FULL.replace("Module Info\n", "Old\n") + "\n" + dark)
    module = bad["ib.link.module"]
    assert module.verdict is Verdict.FAIL
    assert module.message == (
        "OSFP: temperature (C) 81 outside [-5..75]; Rx power (dBm) lane 1 -14.2 outside "
        "[-10.41..6] (the module's own alarm thresholds)"
    )


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (ProbeOutput("mlxlink", "", 127), "exit code 127"),
        (ProbeOutput("mlxlink", None, None, timed_out=True), "timed out"),
        (ProbeOutput("mlxlink", "-E- Failed to open the device: mlx5_9\n", 1), "not recognised"),
        (ProbeOutput("mlxlink", FULL, 1), "exited with 1"),
    ],
)
def test_mlxlink_that_did_not_run_or_failed_is_unknown(
    cluster_yml: Path, output: ProbeOutput, why: str
) -> None:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    results = judge_link_phy(exp, {f"mlxlink.{n.device}": output for n in exp.nics})
    assert len(results) == 2 * len(exp.nics)
    assert {r.verdict for r in results} == {Verdict.UNKNOWN}
    assert all(why in r.message for r in results), results[0].message


def test_no_ber_shown_is_unknown_not_ok(cluster_yml: Path) -> None:
    cut = FULL.split("Physical Counters and BER Info")[0]
    ber = _judge(cluster_yml, "mlx5_0", cut)["ib.link.ber"]
    assert (ber.verdict, ber.message) == (
        Verdict.UNKNOWN,
        "mlxlink: no Physical Counters and BER Info",
    )


def test_mlxlink_runs_per_adapter_where_mft_is_installed_at_standard(cluster_yml: Path) -> None:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    assert exp.mft  # the lab's cluster.yml pins software.mft
    assert not any(p.parser == "mlxlink" for p in probes_for(exp, "quick"))
    plan = probes_for(exp, "standard")
    runs = [p for p in plan if p.parser == "mlxlink"]
    assert [p.command(exp) for p in runs] == [
        ("mlxlink", "-d", f"mlx5_{i}", "-p", "1", "-m", "-c") for i in range(8)
    ]
    assert plan[-len(runs) :] == runs  # after ib_write_bw between nodes, with the last reads
    doc = cluster_yml.read_text(encoding="utf-8").replace('  mft: "4.26.1-3"', "")
    cluster_yml.write_text(doc, encoding="utf-8")
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    assert not any(p.parser == "mlxlink" for p in probes_for(exp, "standard"))


def test_the_lab_fault_fails_exactly_that_node_and_hca(cluster_yml: Path, tmp_path: Path) -> None:
    report = fails_only(
        cluster_yml, tmp_path / "b", fault("ib_ber", "mlx5_2:1E-9"), "ib.link.ber", "standard"
    )
    gpu002 = next(n for n in report.nodes if n.node == "gpu002")
    [bad] = [c for c in gpu002.checks if c.verdict is Verdict.FAIL]
    assert bad.subject == "mlx5_2"
    assert bad.message.startswith("Symbol BER 1.0E-9 (raw 1.0E-6, before FEC)")
