"""Adapters with several ports in one device (gpuctl issue 18, point 1: "every port of every
HCA, not only port 1"): `nics[].ports` in cluster.yml, one expectation per port, each port's
commands, outputs, checks and subject its own.

ConnectX-4 and later show each port as its own device (port 1), which every lab profile has;
ConnectX-3 (`mlx4_0`) and Connect-IB show one device with two ports. The ibstat readings are
real dual-port ConnectX-3 captures (tests/fixtures/ib, ADDED.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.errors import ConfigError
from gpuctl.validation.bundle import _KIND
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, NodeExpectation, expectations, split_port
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.blame import _on_hca
from gpuctl.validation.judges.counters import PORT_ERRORS, judge_ib_port_errors
from gpuctl.validation.judges.infiniband import judge_ib_ports, port_rates
from gpuctl.validation.pairs import loopback_hcas
from gpuctl.validation.probes import (
    ib_write_bw_client,
    ib_write_lat_server,
    perftest_options,
    probes_for,
)
from gpuctl.validation.results import CheckResult, Verdict

IB = ROOT / "tests" / "fixtures" / "ib"
BOTH_ACTIVE = capture_output(IB / "ibstat-cx3-2hca-2ports-all-active-tabs.txt")
IB_AND_ETH = capture_output(IB / "ibstat-cx3-vpi-port1-ib-polling-port2-eth-disabled-spaces.txt")
PERFQUERY = capture_output(IB / "counters" / "perfquery-x-rhel75-lid10-port1-all-zero.txt")

LAB_NICS = """    nics:
      - devices: "mlx5_[0-7]"
        fabric: ib
        rails: true  # GPU i's adapter is mlx5_i, behind its PCIe switch (topo -m)
"""


def _cluster(cluster_yml: Path, nics: str, generation: str = "fdr") -> Path:
    """The lab starter (``cluster_yml``) with ``nics`` for the GPU group, written beside it."""
    text = cluster_yml.read_text(encoding="utf-8")
    assert LAB_NICS in text
    text = text.replace(LAB_NICS, nics).replace("generation: ndr", f"generation: {generation}")
    path = cluster_yml.with_name(f"cluster-{len(list(cluster_yml.parent.glob('cluster*')))}.yml")
    path.write_text(text, encoding="utf-8")
    return path


def _exp(cluster_yml: Path, nics: str) -> NodeExpectation:
    return expectations(load_cluster(_cluster(cluster_yml, nics)))["gpu001"]


TWO_PORTS = """    nics:
      - devices: "mlx4_[0-1]"
        fabric: ib
        ports: [1, 2]
"""


def _problems(cluster_yml: Path, nics: str, extra: str = "") -> str:
    path = _cluster(cluster_yml, nics)
    if extra:
        text = path.read_text(encoding="utf-8").replace(
            "    subnet_manager: switch", f"    subnet_manager: switch\n{extra}"
        )
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    return str(err.value)


def test_each_port_of_a_device_is_its_own_adapter(cluster_yml: Path) -> None:
    exp = _exp(cluster_yml, TWO_PORTS)
    assert [(n.device, n.port, n.name) for n in exp.nics] == [
        ("mlx4_0", 1, "mlx4_0:1"),
        ("mlx4_0", 2, "mlx4_0:2"),
        ("mlx4_1", 1, "mlx4_1:1"),
        ("mlx4_1", 2, "mlx4_1:2"),
    ]
    assert [n.port_subject for n in exp.nics][1] == "mlx4_0/2"
    assert {n.rate_gbps for n in exp.nics} == {56}  # FDR's rate


def test_a_single_port_keeps_the_device_name(cluster_yml: Path) -> None:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    assert [n.name for n in exp.nics] == [f"mlx5_{i}" for i in range(8)]
    # port 2 alone, or a device split over two entries: the port is said
    split = """    nics:
      - devices: "mlx4_0"
        fabric: ib
      - devices: "mlx4_0"
        fabric: ib2
        ports: [2]
"""
    extra = "  - name: ib2\n    kind: infiniband\n    generation: fdr\n"
    path = _cluster(cluster_yml, split)
    text = path.read_text(encoding="utf-8").replace("node_groups:\n", extra + "\nnode_groups:\n")
    path.write_text(text, encoding="utf-8")
    exp = expectations(load_cluster(path))["gpu001"]
    assert [(n.name, n.fabric) for n in exp.nics] == [("mlx4_0:1", "ib"), ("mlx4_0:2", "ib2")]


def test_names_split_back_into_device_and_port() -> None:
    assert split_port("mlx4_0:2") == ("mlx4_0", 2)
    assert split_port("mlx5_0") == ("mlx5_0", 1)
    assert _KIND.fullmatch("perfquery.start.mlx4_0:2")
    assert not _KIND.fullmatch("perfquery.start.mlx4_0/2")  # never a path


@pytest.mark.parametrize(
    ("nics", "extra", "said"),
    [
        (TWO_PORTS.replace("ports: [1, 2]", "ports: [1, 1]"), "", "port '1' is already used"),
        (TWO_PORTS.replace("ports: [1, 2]", "ports: [2]\n        rails: true"), "", "rails"),
        (TWO_PORTS, "    ipoib: {network: 10.10.0.0/16}", "ipoib: not supported yet"),
        (TWO_PORTS.replace("ports: [1, 2]", "ports: [0]"), "", "greater than or equal to 1"),
    ],
)
def test_ports_gpuctl_cannot_serve_are_refused(
    cluster_yml: Path, nics: str, extra: str, said: str
) -> None:
    assert said in _problems(cluster_yml, nics, extra)


def test_doca_ofed_is_refused_for_devices_with_several_ports(cluster_yml: Path) -> None:
    """MLNX_OFED 5.1 and later (DOCA-OFED's driver) dropped ConnectX-3 and Connect-IB."""
    path = _cluster(cluster_yml, TWO_PORTS)
    text = path.read_text(encoding="utf-8")
    assert "\nsoftware:\n" in text
    doca = '\nsoftware:\n  rdma: {stack: doca-ofed, doca_version: "2.9.1"}\n'
    path.write_text(text.replace("\nsoftware:\n", doca), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    assert "not driven by DOCA-OFED" in str(err.value)
    assert "nics[0].ports" in str(err.value)


def test_every_port_gets_its_own_counter_and_phy_reads(cluster_yml: Path) -> None:
    exp = _exp(cluster_yml, TWO_PORTS)
    plan = {p.kind: p.command(exp) for p in probes_for(exp, "standard")}
    assert plan["perfquery.start.mlx4_0:2"] == ("perfquery", "-x", "-C", "mlx4_0", "-P", "2")
    assert plan["perfquery.end.mlx4_1:1"] == ("perfquery", "-x", "-C", "mlx4_1", "-P", "1")
    assert sum(k.startswith("perfquery.start.") for k in plan) == 4
    # MFT 4.26 and later dropped ConnectX-3 (mstflint#590): no mlxlink on such a device; a
    # device's only port, listed beside it, is still read (port 2 alone: several ports)
    assert exp.mft
    assert not [k for k in plan if k.startswith("mlxlink.")]
    mixed = TWO_PORTS + '      - devices: "mlx5_0"\n        fabric: ib\n'
    exp = _exp(cluster_yml, mixed)
    plan = {p.kind: p.command(exp) for p in probes_for(exp, "standard")}
    assert [k for k in plan if k.startswith("mlxlink.")] == ["mlxlink.mlx5_0"]
    assert plan["mlxlink.mlx5_0"] == ("mlxlink", "-d", "mlx5_0", "-p", "1", "-m", "-c")


def test_ib_write_bw_addresses_the_port(cluster_yml: Path) -> None:
    exp = _exp(cluster_yml, TWO_PORTS)
    port2 = exp.nics[1]
    argv = ib_write_bw_client(port2.name, 18515, "198.18.0.12", perftest_options(port2))
    assert argv[:3] == ("ib_write_bw", "-d", "mlx4_0")
    assert argv[-3:] == ("-i", "2", "198.18.0.12")
    assert "-i" not in ib_write_lat_server("mlx5_0", 19539, perftest_options(_single()))
    # alone on its fabric, a node loops back between its device's two ports
    names = [n.name for n in exp.nics if n.device == "mlx4_0"]
    assert loopback_hcas(names) == [("mlx4_0:2", "mlx4_0:1"), ("mlx4_0:1", "mlx4_0:2")]


def _single() -> ExpectedNic:
    return ExpectedNic("mlx5_0", "ib", "infiniband", 400)


def _ports(exp: NodeExpectation, text: str) -> list[CheckResult]:
    return judge_ib_ports(exp, {"ibstat": ProbeOutput("ibstat", text)})


def test_both_ports_of_both_devices_are_judged(cluster_yml: Path) -> None:
    results = _ports(_exp(cluster_yml, TWO_PORTS), BOTH_ACTIVE)
    states = {r.subject: r.verdict for r in results if r.check == "ib.port.state"}
    assert states == dict.fromkeys(["mlx4_0/1", "mlx4_0/2", "mlx4_1/1", "mlx4_1/2"], Verdict.OK)
    assert not [r for r in results if r.verdict is not Verdict.OK]


def test_port_two_down_or_on_ethernet_fails_on_its_own(cluster_yml: Path) -> None:
    """The real VPI card: port 1 InfiniBand without link, port 2 set to Ethernet."""
    exp = _exp(cluster_yml, TWO_PORTS.replace('"mlx4_[0-1]"', "mlx4_0"))
    failed = {(r.check, r.subject) for r in _ports(exp, IB_AND_ETH) if r.verdict is Verdict.FAIL}
    assert ("ib.port.state", "mlx4_0/1") in failed
    assert ("ib.port.state", "mlx4_0/2") in failed
    assert ("ib.port.link_layer", "mlx4_0/2") in failed
    assert ("ib.port.link_layer", "mlx4_0/1") not in failed
    # port 1 only in use: port 2's Ethernet is not this cluster's business
    exp = _exp(cluster_yml, TWO_PORTS.replace('"mlx4_[0-1]"', "mlx4_0").replace(", 2]", "]"))
    assert {r.subject for r in _ports(exp, IB_AND_ETH) if r.verdict is Verdict.FAIL} == {"mlx4_0/1"}


def test_a_port_the_device_does_not_show_is_unknown(cluster_yml: Path) -> None:
    exp = _exp(cluster_yml, TWO_PORTS.replace("[1, 2]", "[1, 2, 3]"))
    missing = [r for r in _ports(exp, BOTH_ACTIVE) if r.verdict is not Verdict.OK]
    assert [(r.verdict, r.subject) for r in missing] == [
        (Verdict.UNKNOWN, "mlx4_0:3"),
        (Verdict.UNKNOWN, "mlx4_1:3"),
    ]
    assert "mlx4_0 shows no port 3" in missing[0].message


def test_each_port_rate_is_the_ceiling_of_its_own_runs() -> None:
    rates = port_rates({"ibstat": ProbeOutput("ibstat", IB_AND_ETH)})
    assert rates == {"mlx4_0/1": 10.0, "mlx4_0/2": 40.0}


def test_counters_of_port_two_are_judged_under_its_name(cluster_yml: Path) -> None:
    exp = _exp(cluster_yml, TWO_PORTS)
    port2 = PERFQUERY.replace("Lid 10 port 1 ", "Lid 10 port 2 ").replace(
        "PortSelect:......................1", "PortSelect:......................2"
    )
    assert port2 != PERFQUERY
    grown = port2.replace(
        "LinkDownedCounter:...............0", "LinkDownedCounter:...............2"
    )
    assert grown != port2
    outputs = {}
    for nic in exp.nics:
        text = port2 if nic.port == 2 else PERFQUERY
        outputs[f"perfquery.start.{nic.name}"] = ProbeOutput("perfquery", text)
        end = grown if nic.name == "mlx4_1:2" else text
        outputs[f"perfquery.end.{nic.name}"] = ProbeOutput("perfquery", end)
    [found] = [r for r in judge_ib_port_errors(exp, outputs) if r.check == PORT_ERRORS]
    assert (found.verdict, found.subject) == (Verdict.FAIL, "mlx4_1:2")
    assert "port 2 LinkDownedCounter +2" in found.message


def test_a_pair_failure_is_tied_to_the_port_that_shows_it() -> None:
    def failed(subject: str) -> CheckResult:
        return CheckResult("ib.port.state", "gpu001", Verdict.FAIL, "down", subject=subject)

    assert _on_hca(failed("mlx4_0/2"), "mlx4_0:2")
    assert not _on_hca(failed("mlx4_0/1"), "mlx4_0:2")
    assert _on_hca(failed("mlx5_0/1"), "mlx5_0")
