"""The GPU record the ``gpu.*`` judges read (:func:`gpuctl.validation.parsers.nvsmi_gpu.smi_of`):
built from ``smi-q``/``smi-xml`` data, with honest types. A value the output did not show is
None (never 0), a number is kept as it is (also one that is not finite: the judge FAILs it),
a section that is absent, empty or not a mapping is None. The data itself is not changed."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from helpers import ROOT

from gpuctl.lab.sim import nvsmi, nvsmi_xml, profiles
from gpuctl.lab.sim.faults import apply
from gpuctl.validation.capture import capture_output
from gpuctl.validation.parsers.nvsmi_gpu import (
    EccCounters,
    Fabric,
    PcieLink,
    RemappedRows,
    smi_of,
)
from gpuctl.validation.parsing import parse

SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"
STAMP = "Mon Jan  6 10:00:00 2025"


def data_of(kind: str, name: str) -> dict[str, Any]:
    result = parse(kind, capture_output(SMI / name))
    assert result.recognised, result.problems
    return result.data


def test_a_full_h100_capture() -> None:
    smi = smi_of(data_of("smi-q", "nvsmi-q-full-h100-sxm-8gpu-565.txt"))
    assert smi.driver_version == "565.57.01"
    assert [g.index for g in smi.gpus] == list(range(8))
    assert [g.subject for g in smi.gpus][:2] == ["GPU0", "GPU1"]
    gpu = smi.gpus[0]
    assert gpu.uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert gpu.pci_bus_id == "00000000:18:00.0"
    assert gpu.minor_number == 0
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.persistence_mode == "Enabled"
    assert gpu.ecc_aggregate == EccCounters(0, 0, 0)
    assert gpu.remapped_rows == RemappedRows(pending=False, failure=False)
    assert gpu.pcie == PcieLink(width_current=16, width_max=16, gen_max=5)
    assert gpu.clocks_active == ("idle",)
    assert gpu.fabric == Fabric("Completed", "Success")
    assert gpu.ids() == {
        "uuid": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "minor_number": 0,
        "index": 0,
    }


def test_what_the_output_does_not_show_is_none_never_zero() -> None:
    # nvidia-smi -q -d PAGE_RETIREMENT: no name, UUID, ECC counters, PCIe or fabric section
    gpu = smi_of(data_of("smi-q", "nvsmi-q-d-page-retirement-8gpu-535.txt")).gpus[0]
    assert gpu.pci_bus_id == "00000001:00:00.0"
    assert (gpu.uuid, gpu.minor_number, gpu.name, gpu.persistence_mode) == (None,) * 4
    assert (gpu.ecc_aggregate, gpu.ecc_volatile, gpu.remapped_rows, gpu.pcie) == (None,) * 4
    assert gpu.fabric is None
    assert gpu.clocks_active == ()
    # V100: the ECC sections exist, the SRAM/DRAM counters of newer drivers do not
    v100 = smi_of(data_of("smi-q", "nvsmi-q-full-v100-sxm2-8gpu-550-single-double-bit.txt"))
    assert v100.gpus[0].ecc_aggregate == EccCounters(None, None, None)
    assert v100.gpus[0].remapped_rows is None  # before Ampere
    # a fragment (one ECC section pasted alone): no driver line
    fragment = smi_of(data_of("smi-q", "nvsmi-q-ecc-section-sram-uncorrectable-fragment.txt"))
    assert fragment.driver_version is None
    assert fragment.gpus[0].ecc_aggregate == EccCounters(5, 0, 0)


def test_persistence_mode_off_and_remap_pending_as_shown() -> None:
    a100 = smi_of(data_of("smi-q", "nvsmi-q-full-a100-sxm4-40gb-8gpu-460.txt"))
    assert {g.persistence_mode for g in a100.gpus} == {"Disabled"}
    a10 = smi_of(data_of("smi-q", "nvsmi-q-full-a10-1gpu-535.txt")).gpus[0]
    assert a10.remapped_rows == RemappedRows(pending=True, failure=False)
    assert a10.fabric == Fabric(None, None)  # the section is printed, its values are N/A


@pytest.mark.parametrize("name", profiles.names())
def test_the_text_and_the_xml_form_give_the_same_record(name: str) -> None:
    profile = profiles.load(name)
    faults = apply(apply({}, "ecc", "0:4"), "clocks_throttled", "all")
    text = smi_of(parse("smi-q", nvsmi.query(profile, faults, "n", STAMP)).data)
    xml = smi_of(parse("smi-xml", nvsmi_xml.query_xml(profile, faults, "n", STAMP)).data)
    assert text == xml
    assert len(text.gpus) == profile["gpus"]["count"]
    assert "hw_slowdown" in text.gpus[0].clocks_active


def _h100_with(edit: Any) -> dict[str, Any]:
    data = copy.deepcopy(data_of("smi-q", "nvsmi-q-full-h100-sxm-8gpu-565.txt"))
    edit(data["gpus"][0])
    return data


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400, -1, 2.5])
def test_a_number_is_kept_as_it_is_even_when_not_finite(value: float) -> None:
    def edit(gpu: dict[str, Any]) -> None:
        gpu["ecc"]["aggregate"]["sram_uncorrectable"] = value
        gpu["pcie"]["width_max"] = value

    gpu = smi_of(_h100_with(edit)).gpus[0]
    assert gpu.ecc_aggregate is not None
    assert gpu.pcie is not None
    for kept in (gpu.ecc_aggregate.sram_uncorrectable, gpu.pcie.width_max):
        assert kept is value or (math.isnan(value) and math.isnan(kept or 0.0))


@pytest.mark.parametrize("value", ["12", True, None, [], {}])
def test_what_is_not_a_number_is_none(value: Any) -> None:
    def edit(gpu: dict[str, Any]) -> None:
        gpu["ecc"]["aggregate"]["dram_correctable"] = value
        gpu["pcie"]["gen_max"] = value

    gpu = smi_of(_h100_with(edit)).gpus[0]
    assert gpu.ecc_aggregate is not None
    assert gpu.pcie is not None
    assert gpu.ecc_aggregate.dram_correctable is None
    assert gpu.pcie.gen_max is None


def test_sections_that_are_empty_or_not_mappings_are_none() -> None:
    def edit(gpu: dict[str, Any]) -> None:
        gpu["remapped_rows"] = {}
        gpu["pcie"] = "x16"
        gpu["fabric"] = ["Completed"]
        gpu["clocks_event_reasons"] = None
        gpu["ecc"] = {"aggregate": {}, "volatile": {"sram_uncorrectable": 3}}

    gpu = smi_of(_h100_with(edit)).gpus[0]
    assert (gpu.remapped_rows, gpu.pcie, gpu.fabric) == (None, None, None)
    assert gpu.clocks_active == ()
    assert gpu.ecc_aggregate is None
    assert gpu.ecc_volatile == EccCounters(3, None, None)


def test_flags_are_true_only_when_true() -> None:
    def edit(gpu: dict[str, Any]) -> None:
        gpu["remapped_rows"] = {"pending": "Yes", "failure": None}
        gpu["clocks_event_reasons"] = {"hw_slowdown": "Active", "sw_thermal_slowdown": True}

    gpu = smi_of(_h100_with(edit)).gpus[0]
    assert gpu.remapped_rows == RemappedRows(pending=False, failure=None)
    assert gpu.clocks_active == ("sw_thermal_slowdown",)


def test_the_data_is_not_changed_and_odd_listings_are_read_as_none() -> None:
    data = data_of("smi-xml", "nvsmi-q-x-a10g-1gpu-515.txt")
    before = copy.deepcopy(data)
    assert len(smi_of(data).gpus) == 1
    assert data == before
    assert smi_of({"gpus": None}).gpus == ()
    assert smi_of({"gpus": {"0": {}}, "driver_version": None}).gpus == ()
    assert smi_of({}).driver_version is None
    [gpu] = smi_of({"gpus": [{"minor_number": "7", "uuid": False}]}).gpus
    assert (gpu.index, gpu.minor_number, gpu.uuid) == (0, "7", None)  # index: its position
