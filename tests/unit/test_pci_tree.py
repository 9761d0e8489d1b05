"""The PCIe tree between GPUs and NICs (issue 18, point 7): ACS on the switch ports above them
and each adapter's negotiated link, read from `lspci -vvv` on real captures of an 8x H100 HGX,
judged, and printed by the lab's stand-in under its faults."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.lab.sim import faults as sim_faults
from gpuctl.lab.sim import nvsmi_xml, profiles
from gpuctl.lab.sim import pci as sim_pci
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges.base import Evidence, ProbeOutput
from gpuctl.validation.judges.pci import (
    acs_findings,
    adapters,
    bus_address,
    judge_nic_links,
    judge_pcie_acs,
)
from gpuctl.validation.parsers.pci import parse_lspci, pci_devices_of
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "pci"
FULL = FIX / "lspci-vvv-hgx-h100-8gpu-pex890xx-cx7-switchtec-acs-full.txt"
SWITCHTEC = FIX / "lspci-vvv-hgx-h100-switchtec-nvswitch-ports-acs-redirect-excerpt.txt"
ONE_SWITCH = FIX / "lspci-vvv-hgx-h100-one-pex890xx-switch-gpu-cx7-cx6dx-excerpt.txt"


def h100() -> NodeExpectation:
    return expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]


def devices(path: Path) -> tuple:  # type: ignore[type-arg]
    return pci_devices_of(parse_lspci(capture_output(path)).data)


def verdicts(results: list[CheckResult], check: str) -> dict[str | None, Verdict]:
    return {r.subject: r.verdict for r in results if r.check == check}


def test_the_nvswitch_ports_of_a_real_hgx_redirect_and_are_found_above_their_devices() -> None:
    bridges = devices(SWITCHTEC)
    nvswitches = {d.address: d.address for d in bridges if "22a3" in d.name}
    assert len(nvswitches) == 4
    bad, ports = acs_findings(bridges, nvswitches)
    assert ports == 5  # the Switchtec upstream port and its four downstream ports
    assert [b.address for b, _ in bad] == [f"0000:82:0{i}.0" for i in range(4)]
    assert bad[0][1] == ["0000:83:00.0"]


def test_the_gpus_and_adapters_of_the_same_real_hgx_have_acs_off_above_them() -> None:
    everything = devices(FULL)
    gpus = [d for d in everything if d.device_class == "3D controller"]
    nics = adapters(everything)
    assert (len(gpus), len(nics)) == (8, 14)
    endpoints = {d.address: d.address for d in gpus + nics}
    bad, ports = acs_findings(everything, endpoints)
    assert bad == []
    assert ports >= 16  # each GPU's and adapter's PEX890xx downstream and upstream ports


def test_a_gen4_adapter_behind_a_gen5_port_is_not_called_degraded() -> None:
    # 1b:00.0 is a ConnectX-6 Dx (Gen4) on PEX890xx port 17:03.0 (Gen5), which lspci marks
    # "16GT/s (downgraded)": the link runs at what the card can do
    one = ProbeOutput("lspci.nics", capture_output(ONE_SWITCH))
    res = judge_nic_links(h100(), Evidence({"lspci.nics": one, "lspci.bridges": one}))
    assert verdicts(res, "pcie.nic.link") == {
        "0000:1a:00.0": Verdict.OK,  # ConnectX-7 x16 Gen5
        "0000:1b:00.0": Verdict.OK,  # ConnectX-6 Dx, function 1 not judged again
    }
    assert "x16 at 16 GT/s = x16 at 16 GT/s" in next(
        r.message for r in res if r.subject == "0000:1b:00.0"
    )


def test_a_narrower_link_than_the_adapter_and_its_port_can_do_fails() -> None:
    text = capture_output(ONE_SWITCH).replace(
        "LnkSta:\tSpeed 32GT/s (ok), Width x16 (ok)\n\t\t\tTrErr- Train- SlotClk+ DLActive-",
        "LnkSta:\tSpeed 32GT/s (ok), Width x8 (downgraded)\n\t\t\tTrErr- Train- SlotClk+ DLActive-",
    )
    assert text != capture_output(ONE_SWITCH)
    out = ProbeOutput("lspci.nics", text)
    res = judge_nic_links(h100(), Evidence({"lspci.nics": out, "lspci.bridges": out}))
    [bad] = [r for r in res if r.verdict is Verdict.FAIL]
    assert bad.subject == "0000:1a:00.0"
    assert "x8 at 32 GT/s, below x16 at 32 GT/s" in bad.message


def test_what_lspci_could_not_read_is_unknown_never_ok() -> None:
    denied = (
        "0000:17:01.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)\n"
        "\tBus: primary=17, secondary=19, subordinate=19, sec-latency=0\n"
        "\tCapabilities: <access denied>\n"
    )
    out = ProbeOutput("lspci.bridges", denied)
    assert verdicts(judge_pcie_acs(h100(), Evidence({"lspci.bridges": out})), "pcie.acs") == {
        None: Verdict.UNKNOWN
    }
    empty = ProbeOutput("lspci.nics", "")
    [r] = judge_nic_links(h100(), Evidence({"lspci.nics": empty}))
    assert r.verdict is Verdict.UNKNOWN  # cluster.yml gives this node 8 adapters
    assert "empty input" in r.message
    failed = ProbeOutput("lspci.bridges", "", rc=1)
    [r] = judge_pcie_acs(h100(), Evidence({"lspci.bridges": failed}))
    assert r.verdict is Verdict.UNKNOWN
    timed_out = ProbeOutput("lspci.bridges", None, timed_out=True)
    [r] = judge_pcie_acs(h100(), Evidence({"lspci.bridges": timed_out}))
    assert r.verdict is Verdict.UNKNOWN


def test_no_bridge_at_all_is_no_switch_port_above_anything() -> None:
    # lspci -d ::0604 exits 0 and prints nothing where the GPUs sit on the root bus (a VM)
    none = ProbeOutput("lspci.bridges", "")
    [r] = judge_pcie_acs(h100(), Evidence({"lspci.bridges": none}))
    assert r.verdict is Verdict.OK
    assert "no PCI bridge" in r.message


def test_without_the_gpus_addresses_acs_is_unknown_for_them() -> None:
    out = ProbeOutput("lspci.bridges", capture_output(ONE_SWITCH))
    res = judge_pcie_acs(h100(), Evidence({"lspci.bridges": out}))
    assert [r.verdict for r in res] == [Verdict.UNKNOWN]


def test_nvidia_smi_bus_ids_become_lspci_addresses() -> None:
    assert bus_address("00000000:3A:00.0") == "0000:3a:00.0"
    assert bus_address("0001:81:00.0") == "0001:81:00.0"


# ------------------------------------------------------------------------------------------
# The lab's stand-in


def lab_evidence(profile: str, faults: dict | None = None) -> Evidence:  # type: ignore[type-arg]
    hw = profiles.load(profile)
    faults = faults or {}

    def run(*args: str) -> str:
        status, out, err = sim_pci.lspci(hw, faults, list(args))
        assert (status, err) == (0, "")
        return out

    return Evidence(
        {
            "lspci.bridges": ProbeOutput("lspci.bridges", run("-vvv", "-D", "-d", "::0604")),
            "lspci.nics": ProbeOutput("lspci.nics", run("-vvv", "-D", "-d", "15b3:")),
            "smi-xml": ProbeOutput("smi-xml", nvsmi_xml.query_xml(hw, faults, "gpu002")),
        }
    )


@pytest.mark.parametrize("profile", ["hgx-h100-ndr", "a100-hdr", "a100-roce", "l40s-pcie"])
def test_every_lab_profile_is_healthy(profile: str) -> None:
    ev = lab_evidence(profile)
    res = judge_pcie_acs(h100(), ev) + judge_nic_links(h100(), ev)
    assert res
    assert {r.verdict for r in res} == {Verdict.OK}, [r.message for r in res]
    text = ev["lspci.bridges"].text or ""
    assert not parse_lspci(text).problems


def test_the_acs_fault_fails_the_switch_port_above_that_gpu_only() -> None:
    ev = lab_evidence("hgx-h100-ndr", sim_faults.apply({}, "pcie_acs", "2"))
    res = judge_pcie_acs(h100(), ev)
    assert verdicts(res, "pcie.acs") == {"0000:39:00.0": Verdict.FAIL}
    assert "above GPU2" in res[0].message


def test_the_nic_link_fault_fails_that_adapter_only() -> None:
    ev = lab_evidence("hgx-h100-ndr", sim_faults.apply({}, "nic_pcie_degraded", "mlx5_3:8:4"))
    found = verdicts(judge_nic_links(h100(), ev), "pcie.nic.link")
    assert [a for a, v in found.items() if v is Verdict.FAIL] == ["0000:5e:00.0"]
    assert len(found) == 8


def test_lspci_filters_and_refuses_what_it_does_not_know() -> None:
    hw = profiles.load("hgx-h100-ndr")
    _, gpus, _ = sim_pci.lspci(hw, {}, ["-D", "-d", "10de:"])
    assert gpus.count("3D controller: NVIDIA") == 8
    _, short, _ = sim_pci.lspci(hw, {}, ["-d", "15b3:"])
    assert short.splitlines()[0] == (
        "19:00.0 Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]"
    )
    status, _, err = sim_pci.lspci(hw, {}, ["-x"])
    assert status == 2
    assert "invalid option" in err


def test_faults_naming_hardware_the_profile_lacks_are_refused() -> None:
    single = profiles.load("single-gpu")
    value = sim_faults.parse_value("pcie_acs", "0")
    assert "root port" in str(sim_faults.hardware_problem("pcie_acs", value, single, "gpu001"))
    h100_hw = profiles.load("hgx-h100-ndr")
    nic = sim_faults.parse_value("nic_pcie_degraded", "mlx5_9")
    assert "no HCA mlx5_9" in str(
        sim_faults.hardware_problem("nic_pcie_degraded", nic, h100_hw, "gpu002")
    )
    with pytest.raises(sim_faults.FaultError, match="width 3"):
        sim_faults.parse_value("nic_pcie_degraded", "mlx5_0:3")
