"""The lab's simulated hardware: every stand-in output is read by gpuctl's own parsers, the values
match the profile, and each fault shows through the parser."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT, STANDIN_CODE, sim_node_env, standin_pair

from gpuctl.lab.sim import (
    dcgm,
    fabric,
    ib,
    kernel,
    mft,
    nvsmi,
    nvsmi_xml,
    perf,
    profiles,
    standin,
)
from gpuctl.lab.sim.faults import NAMES, FaultError, apply, clear, parse_assignment, validate
from gpuctl.validation.capture import capture_output
from gpuctl.validation.parsing import ParseResult, parse

NODE = "gpu-node-01"
PROFILES = profiles.names()
GIB8 = 8 << 30


def _ok(kind: str, text: str, **options: Any) -> ParseResult:
    result = parse(kind, text, **options)
    assert result.recognised, (kind, result.problems, text[:400])
    assert result.problems == (), (kind, result.problems)
    return result


def _profile(name: str) -> dict[str, Any]:
    return profiles.load(name)


def _nccl(profile: dict[str, Any], faults: dict[str, Any], gpus: int | None = None) -> str:
    count = profile["gpus"]["count"] if gpus is None else gpus
    return perf.all_reduce_perf(profile, faults, NODE, perf.NcclArgs(8, GIB8, 2, count))


def _bw(profile: dict[str, Any], faults: dict[str, Any], device: str | None = None) -> str:
    args = perf.PerftestArgs(server="peer", device=device, size=8 << 20, gbits=True)
    return perf.ib_write_bw(profile, faults, NODE, args)


# ------------------------------------------------------------------------------------------
# Profiles


def test_profiles_are_the_five_shapes() -> None:
    assert PROFILES == ["a100-hdr", "a100-roce", "hgx-h100-ndr", "l40s-pcie", "single-gpu"]


@pytest.mark.parametrize("name", PROFILES)
def test_profile_consistent_with_catalog(name: str) -> None:
    profile = _profile(name)
    models = yaml.safe_load((ROOT / "gpuctl/data/gpu_models.yml").read_text())
    fabrics = yaml.safe_load((ROOT / "gpuctl/data/fabrics.yml").read_text())
    model = models[profile["model"]]
    assert profile["gpus"]["name"] == model["product_name"]
    assert profile["gpus"]["count"] <= model["max_per_node"]
    assert profile["gpus"]["pcie"]["gen"] == model["pcie_gen"]
    if model["nvlink_per_pair"]:
        assert profile["topology"]["gpu_gpu"] == model["nvlink_per_pair"]
    floor = model["thresholds"]["nccl_all_reduce_busbw_gbs"]
    if floor is not None:
        assert profile["expected"]["nccl_all_reduce_busbw_gbs"] >= floor
    nics = profile["nics"]
    if nics:
        if nics["link_layer"] == "InfiniBand":
            table = next(f for f in fabrics["infiniband"].values() if nics["rate"] in f["rates"])
        else:
            table = fabrics["roce"]
        assert profile["expected"]["ib_write_bw_gbps"] >= table["ib_write_bw_gbps"][nics["rate"]]
        assert profile["expected"]["ib_write_bw_gbps"] < nics["rate"]
    assert profile["driver_version"] == "570.172.08"
    assert profile["cuda_version"] == "12.8"
    assert json.loads(profiles.profile_json(name)) == profile


def test_unknown_profile() -> None:
    with pytest.raises(profiles.ProfileError, match="unknown hardware profile"):
        profiles.load("dgx-9000")


# ------------------------------------------------------------------------------------------
# Healthy nodes: every output parses, values match the profile


@pytest.mark.parametrize("name", PROFILES)
def test_nvidia_smi_outputs(name: str) -> None:
    profile = _profile(name)
    spec = profile["gpus"]
    count = spec["count"]

    table = _ok("smi-table", nvsmi.table(profile, {}, NODE)).data
    assert table["gpu_count"] == count
    assert table["driver_version"] == "570.172.08"
    assert table["cuda_version"] == "12.8"
    for gpu in table["gpus"]:  # the table truncates long names as nvidia-smi does ("...")
        assert spec["name"].startswith(gpu["name"].removesuffix("..."))
    assert [g["bus_id"] for g in table["gpus"]] == spec["bus_ids"]
    assert {g["memory_total_mib"] for g in table["gpus"]} == {spec["memory_mib"]}
    assert {g["power_cap_w"] for g in table["gpus"]} == {spec["power_limit_w"]}

    q = _ok("smi-q", nvsmi.query(profile, {}, NODE)).data
    assert q["attached_gpus"] == count
    assert q["driver_version"] == "570.172.08"
    for gpu in q["gpus"]:
        assert gpu["name"] == spec["name"]
        assert gpu["vbios_version"] == profile["firmware"]["gpu_vbios"]
        pcie = spec["pcie"]
        assert gpu["pcie"]["gen_current"] == gpu["pcie"]["gen_max"] == pcie["gen"]
        assert gpu["pcie"]["width_current"] == gpu["pcie"]["width_max"] == pcie["width"]
        assert gpu["ecc"]["volatile"]["dram_uncorrectable"] == 0
        assert gpu["remapped_rows"]["pending"] is False
        assert gpu["clocks_event_reasons"]["hw_slowdown"] is False
        assert gpu["power"]["limit_w"] == spec["power_limit_w"]
        expected_state = "Completed" if spec["nvswitch"] else None
        assert gpu["fabric"]["state"] == expected_state
    assert len({g["uuid"] for g in q["gpus"]}) == count

    fields = list(nvsmi.FIELDS)
    csv = _ok("smi-csv", nvsmi.query_csv(profile, {}, NODE, fields)).data
    assert len(csv["values"]) == count
    row = csv["values"][0]
    assert row["name"] == spec["name"]
    assert row["memory.total [MiB]"] == spec["memory_mib"]
    assert row["ecc.errors.uncorrected.volatile.total"] == 0
    assert row["pcie.link.width.current"] == spec["pcie"]["width"]
    noheader = nvsmi.query_csv(profile, {}, NODE, ["name", "pci.bus_id"], header=False)
    values = _ok("smi-csv", noheader, fields=["name", "pci.bus_id"]).data["values"]
    assert [v["pci.bus_id"] for v in values] == spec["bus_ids"]

    listing = _ok("smi-list", nvsmi.listing(profile, {}, NODE)).data
    assert len(listing["gpus"]) == count


@pytest.mark.parametrize("name", PROFILES)
def test_topology(name: str) -> None:
    profile = _profile(name)
    data = _ok("topo", nvsmi.topo(profile, {}, NODE)).data
    count = profile["gpus"]["count"]
    nics = profile["nics"]["ports"] if profile["nics"] else []
    assert data["gpus"] == [f"GPU{i}" for i in range(count)]
    assert data["nic_names"] == {f"NIC{i}": port["name"] for i, port in enumerate(nics)}
    rule = profile["topology"]["gpu_gpu"]
    for a in range(count):
        for b in range(count):
            if a == b:
                continue
            token = data["links"][f"GPU{a}"][f"GPU{b}"]
            if rule.startswith("NV"):
                assert token == rule
            else:
                assert token in ("PIX", "PXB", "SYS")
    if name == "l40s-pcie":
        assert data["links"]["GPU0"]["GPU1"] == "PIX"
        assert data["links"]["GPU0"]["GPU2"] == "PXB"
        assert data["links"]["GPU0"]["GPU4"] == "SYS"


@pytest.mark.parametrize("name", PROFILES)
def test_nvlink_status(name: str) -> None:
    profile = _profile(name)
    text = nvsmi.nvlink_status(profile, {}, NODE)
    links = profile["gpus"]["nvlink"]["links"]
    if not links:  # PCIe GPUs: a GPU line each, no link lines (the parser: nothing to read)
        assert text.count("GPU ") == profile["gpus"]["count"]
        assert "Link" not in text
        return
    data = _ok("nvlink", text).data
    assert data["gpu_count"] == profile["gpus"]["count"]
    assert data["inactive_links"] == 0
    assert data["active_links"] == links * profile["gpus"]["count"]
    speeds = {link["speed_gbs"] for gpu in data["gpus"] for link in gpu["links"]}
    assert speeds == {profile["gpus"]["nvlink"]["speed_gbs"]}


@pytest.mark.parametrize("name", PROFILES)
def test_infiniband_outputs(name: str) -> None:
    profile = _profile(name)
    nics = profile["nics"]
    if not nics:
        assert ib.ibstat(profile, {}, NODE) == ""
        assert ib.ibdev2netdev(profile, {}, NODE) == ""
        with pytest.raises(ib.IbError, match="No IB devices found"):
            ib.ibv_devinfo(profile, {}, NODE)
        return
    names = [port["name"] for port in nics["ports"]]
    cas = _ok("ibstat", ib.ibstat(profile, {}, NODE)).data["cas"]
    assert list(cas) == names
    for ca in cas.values():
        assert ca["firmware_version"] == profile["firmware"]["hca"]
        assert ca["ca_type"] == nics["ca_type"]
        port = ca["ports"]["1"]
        assert port["state"] == "Active"
        assert port["physical_state"] == "LinkUp"
        assert port["rate"] == nics["rate"]
        assert port["link_layer"] == nics["link_layer"]
    assert len({ca["node_guid"] for ca in cas.values()}) == len(names)

    devinfo = _ok("ibv-devinfo", ib.ibv_devinfo(profile, {}, NODE)).data
    verbose = _ok("ibv-devinfo", ib.ibv_devinfo(profile, {}, NODE, verbose=True)).data
    assert devinfo["hcas"].keys() == verbose["hcas"].keys() == set(names)
    netdev = _ok("ibdev2netdev", ib.ibdev2netdev(profile, {}, NODE)).data
    assert json.dumps(netdev).count('"Up"') == len(names)


@pytest.mark.parametrize("name", PROFILES)
def test_firmware_tools(name: str) -> None:
    profile = _profile(name)
    nics = profile["nics"]
    if not nics:
        with pytest.raises(mft.MftError, match="No devices found"):
            mft.mlxfwmanager_query(profile, {}, NODE)
        return
    names = [port["name"] for port in nics["ports"]]
    for faults, want in (({}, profile["firmware"]["hca"]), (_faults("firmware=hca=28.39.1002"),
                                                            "28.39.1002")):  # fmt: skip
        devices = _ok("mlxfwmanager", mft.mlxfwmanager_query(profile, faults, NODE)).data
        devices = devices["devices"]
        assert len(devices) == len(names)
        for device in devices:
            assert device["versions"]["FW"] == {"current": want, "available": None}
            assert device["psid"] == nics["board_id"]
            assert device["device_type"] == mft.device_type(nics["ca_type"])
            assert device["status"] == "No matching image found"
        assert len({device["base_guid"] for device in devices}) == len(names)
        for index, hca in enumerate(names):
            flint = _ok("flint-query", mft.flint_query(profile, faults, NODE, hca)).data
            assert flint["fw_version"] == want
            assert flint["psid"] == nics["board_id"]
            assert flint["base_guid"] == devices[index]["base_guid"]
            assert flint["base_mac"] == devices[index]["base_mac"]
            pci = devices[index]["pci_device_name"]
            assert mft.flint_query(profile, faults, NODE, pci) == mft.flint_query(
                profile, faults, NODE, hca
            )
    with pytest.raises(mft.MftError, match="Cannot open Device"):
        mft.flint_query(profile, {}, NODE, "/dev/mst/nope")


def test_firmware_tools_standin_dispatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    (tmp_path / "hw.json").write_text(profiles.profile_json(H100), encoding="utf-8")
    monkeypatch.setenv("GPUCTL_SIM_PROFILE", str(tmp_path / "hw.json"))
    monkeypatch.setenv("GPUCTL_SIM_FAULTS", str(tmp_path / "faults.json"))
    monkeypatch.setenv("GPUCTL_SIM_NODE", NODE)
    out, err = io.StringIO(), io.StringIO()
    assert standin.main("/usr/bin/mlxfwmanager", ["--query"], out, err) == 0
    profile = _profile(H100)
    devices = _ok("mlxfwmanager", out.getvalue()).data["devices"]
    assert len(devices) == len(profile["nics"]["ports"])
    out = io.StringIO()
    assert standin.main("flint", ["-d", devices[0]["pci_device_name"], "query"], out, err) == 0
    assert _ok("flint-query", out.getvalue()).data["fw_version"] == profile["firmware"]["hca"]
    assert standin.main("flint", ["-d", "mlx5_99", "query"], out, err) == 1
    assert standin.main("mlxfwmanager", ["--bogus"], out, err) == 3  # bad arguments


def _devinfo_states(text: str) -> dict[str, str]:
    data = _ok("ibv-devinfo", text).data
    return {name: hca["ports"]["1"]["state"] for name, hca in data["hcas"].items()}


@pytest.mark.parametrize("name", PROFILES)
def test_benchmarks(name: str) -> None:
    profile = _profile(name)
    data = _ok("nccl", _nccl(profile, {})).data
    assert data["params"]["n_gpus"] == profile["gpus"]["count"]
    assert len(data["ranks"]) == profile["gpus"]["count"]
    assert {r["name"] for r in data["ranks"]} == {profile["gpus"]["name"]}
    last = data["rows"][-1]
    assert last["size"] == GIB8
    expected = profile["expected"]["nccl_all_reduce_busbw_gbs"]
    assert last["out_of_place"]["busbw"] == pytest.approx(expected, rel=0.02, abs=0.01)
    assert last["out_of_place"]["wrong"] == 0
    assert data["out_of_bounds"] == 0
    assert data["out_of_bounds_ok"] is True
    assert data["avg_busbw"] is not None
    assert [row["size"] for row in data["rows"]] == [8 << i for i in range(31)]

    if not profile["nics"]:
        with pytest.raises(perf.ToolFailure, match="No IB devices found"):
            _bw(profile, {})
        return
    for server in ("peer", None):
        args = perf.PerftestArgs(server=server, size=8 << 20, gbits=True)
        bw = _ok("perftest", perf.ib_write_bw(profile, {}, NODE, args)).data
        assert bw["role"] == ("client" if server else "server")
        assert bw["bw_unit"] == "Gb/sec"
        assert bw["rows"][0]["bytes"] == 8 << 20
        expected_bw = profile["expected"]["ib_write_bw_gbps"]
        assert bw["rows"][0]["bw_average"] == pytest.approx(expected_bw, rel=0.001)
    all_sizes = perf.PerftestArgs(server="peer", all_sizes=True)
    rows = _ok("perftest", perf.ib_write_bw(profile, {}, NODE, all_sizes)).data["rows"]
    assert rows[0]["bytes"] == 2
    assert rows[-1]["bytes"] == 8 << 20
    # RoCE: the GID index perftest prints is the one -x asked for (0 without: perftest's
    # usage text, "Default : IB - no gid . ETH - 0")
    ethernet = profile["nics"]["link_layer"] == "Ethernet"
    for gid, shown in ((None, "0"), (5, "5")):
        gid_args = perf.PerftestArgs(server="peer", gid_index=gid)
        settings = _ok("perftest", perf.ib_write_bw(profile, {}, NODE, gid_args)).data["settings"]
        assert settings.get("GID index") == (shown if ethernet else None)


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_dcgm_diag_pass(name: str, level: int) -> None:
    profile = _profile(name)
    text, status = dcgm.diag(profile, {}, NODE, level)
    data = _ok("dcgm-diag", text).data
    assert status == 0
    assert data["overall"] == "Pass"
    assert data["summary"]["Fail"] == 0
    assert data["driver_version"] == "570.172.08"


def test_fabric_manager_healthy() -> None:
    profile = _profile("hgx-h100-ndr")
    text, status = fabric.systemctl_status(profile, {}, NODE)
    assert status == 0
    assert _ok("fabricmanager", text).data["active"] is True
    assert fabric.version_text(profile, {}) == "Fabric Manager version is : 570.172.08\n"
    assert fabric.version_text(_profile("l40s-pcie"), {}) is None


def test_healthy_kernel_log_has_no_xid() -> None:
    assert kernel.kernel_log_lines(_profile("hgx-h100-ndr"), {}) == []


# ------------------------------------------------------------------------------------------
# Faults


def _faults(*assignments: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for text in assignments:
        name, _, value = text.partition("=")
        result = apply(result, name, value)
    return result


H100 = "hgx-h100-ndr"


def test_fault_names_and_errors() -> None:
    assert set(NAMES) == {
        "gpu_lost", "xid", "ecc", "nvlink_degraded", "pcie_degraded", "ib_port_down", "ib_rate",
        "nccl_slow", "nccl_wrong", "fabricmanager_failed", "fabricmanager_version",
        "clocks_throttled", "slow_node", "firmware", "no_reboot", "fw_update_fails", "pcie_aer",
        "pcie_acs", "nic_pcie_degraded", "p2p_slow", "p2p_disabled",
        "nvlink_errors", "ib_link_flaps", "ib_ber", "nccl_collective_slow", "pcie_copy_slow",
        "gpudirect_broken", "ib_latency", "nic_slots_swapped", "roce_errors",
        "thermal_throttle", "nccl_drift",
    }  # fmt: skip
    with pytest.raises(FaultError, match="unknown fault 'gpu_melted'"):
        apply({}, "gpu_melted", "1")
    with pytest.raises(FaultError, match="unknown fault"):
        validate({"nope": 1})
    for name, value in [
        ("gpu_lost", "x"),
        ("xid", "79"),
        ("nccl_slow", "1.5"),
        ("nccl_collective_slow", "0.5"),
        ("nccl_collective_slow", "broadcast:0.5"),
        ("nccl_collective_slow", "alltoall:1.5"),
        ("nvlink_degraded", "1-1"),
        ("nvlink_errors", "3"),
        ("nvlink_errors", "3:18"),
        ("ib_link_flaps", "eth0"),
        ("ib_link_flaps", "mlx5_0:0"),
        ("ib_ber", "eth0"),
        ("ib_ber", "mlx5_0:0.1"),
        ("ib_ber", "mlx5_0:1E-2"),
        ("pcie_degraded", "0:3"),
        ("pcie_copy_slow", "x"),
        ("pcie_copy_slow", "2:0"),
        ("ib_port_down", "mlx5_0:Sleeping"),
        ("ib_rate", "mlx5_0:123"),
        ("firmware", "bios=1.2"),
    ]:
        with pytest.raises(FaultError):
            apply({}, name, value)
    assert parse_assignment("ib_port_down=mlx5_3") == ("ib_port_down", {"mlx5_3": "Down"})
    faults = _faults("ib_port_down=mlx5_1", "ib_port_down=mlx5_2:Disabled", "slow_node=0.5")
    assert faults["ib_port_down"] == {"mlx5_1": "Down", "mlx5_2": "Disabled"}
    assert clear(faults, "slow_node") == {"ib_port_down": faults["ib_port_down"]}
    assert clear(faults) == {}


def test_gpu_lost() -> None:
    profile = _profile(H100)
    faults = _faults("gpu_lost=3")
    q = _ok("smi-q", nvsmi.query(profile, faults, NODE)).data
    assert q["attached_gpus"] == 7
    assert "00000000:5D:00.0" not in [g["pci_bus_id"] for g in q["gpus"]]
    assert _ok("smi-table", nvsmi.table(profile, faults, NODE)).data["gpu_count"] == 7
    xid = _ok("xid", "\n".join(kernel.kernel_log_lines(profile, faults))).data
    assert xid["counts"] == {"79": 1}
    assert xid["fallen_off_bus"][0]["pci"] == "0000:5d:00"
    with pytest.raises(perf.ToolFailure, match="invalid device ordinal"):
        _nccl(profile, faults, gpus=8)
    assert _ok("nccl", _nccl(profile, faults, gpus=7)).data["params"]["n_gpus"] == 7


def test_xid() -> None:
    faults = _faults("xid=13:2,119:5")
    lines = kernel.kernel_log_lines(_profile(H100), faults)
    data = _ok("xid", "\n".join(lines)).data
    assert data["counts"] == {"13": 1, "119": 1}
    assert [e["pci"] for e in data["events"]] == ["0000:3a:00", "0000:ab:00"]
    iso = _ok("xid", kernel.dmesg(_profile(H100), faults, NODE, iso=True)).data
    assert iso["counts"] == {"13": 1, "119": 1}
    assert iso["events"][0]["timestamp"]


def test_ecc() -> None:
    profile = _profile(H100)
    faults = _faults("ecc=1:4")
    gpu = _ok("smi-q", nvsmi.query(profile, faults, NODE)).data["gpus"][1]
    assert gpu["ecc"]["volatile"]["dram_uncorrectable"] == 4
    assert gpu["remapped_rows"]["pending"] is True
    table = _ok("smi-table", nvsmi.table(profile, faults, NODE)).data
    assert table["gpus"][1]["volatile_uncorrected_ecc"] == 4
    field = "ecc.errors.uncorrected.volatile.total"
    csv = _ok("smi-csv", nvsmi.query_csv(profile, faults, NODE, [field])).data
    assert [v[field] for v in csv["values"]] == [0, 4, 0, 0, 0, 0, 0, 0]
    xid = _ok("xid", "\n".join(kernel.kernel_log_lines(profile, faults))).data
    assert xid["counts"] == {"48": 1, "63": 1}
    text, status = dcgm.diag(profile, faults, NODE, 2)
    assert status != 0
    assert _ok("dcgm-diag", text).data["overall"] == "Fail"


def test_nvlink_degraded() -> None:
    profile = _profile(H100)
    faults = _faults("nvlink_degraded=0-1:4")
    topo = _ok("topo", nvsmi.topo(profile, faults, NODE)).data
    assert topo["links"]["GPU0"]["GPU1"] == "NV14"
    assert topo["links"]["GPU1"]["GPU0"] == "NV14"
    assert topo["links"]["GPU0"]["GPU2"] == "NV18"
    nvlink = _ok("nvlink", nvsmi.nvlink_status(profile, faults, NODE)).data
    assert nvlink["inactive_links"] == 8
    assert [link["active"] for link in nvlink["gpus"][0]["links"]].count(False) == 4
    busbw = _ok("nccl", _nccl(profile, faults)).data["rows"][-1]["out_of_place"]["busbw"]
    assert busbw < 460


def test_pcie_degraded() -> None:
    profile = _profile(H100)
    faults = _faults("pcie_degraded=2:8:4")
    gpu = _ok("smi-q", nvsmi.query(profile, faults, NODE)).data["gpus"][2]
    want = {"gen_current": 4, "gen_max": 5, "width_current": 8, "width_max": 16}
    assert {key: gpu["pcie"][key] for key in want} == want
    fields = ["pcie.link.gen.current", "pcie.link.width.current"]
    csv = _ok("smi-csv", nvsmi.query_csv(profile, faults, NODE, fields)).data["values"]
    assert csv[2] == {"pcie.link.gen.current": 4, "pcie.link.width.current": 8}
    text, status = dcgm.diag(profile, faults, NODE, 2)
    pcie = next(t for t in _ok("dcgm-diag", text).data["tests"] if t["name"] == "pcie")
    assert status != 0
    assert pcie["result"] == "Fail"
    assert pcie["gpus"]["2"] == "Fail"


def test_ib_port_down() -> None:
    profile = _profile(H100)
    faults = _faults("ib_port_down=mlx5_3:Disabled")
    cas = _ok("ibstat", ib.ibstat(profile, faults, NODE)).data["cas"]
    assert cas["mlx5_3"]["ports"]["1"]["state"] == "Down"
    assert cas["mlx5_3"]["ports"]["1"]["physical_state"] == "Disabled"
    assert cas["mlx5_2"]["ports"]["1"]["state"] == "Active"
    assert _devinfo_states(ib.ibv_devinfo(profile, faults, NODE))["mlx5_3"].startswith("PORT_DOWN")
    netdev = ib.ibdev2netdev(profile, faults, NODE)
    assert "mlx5_3 port 1 ==> ibp93s0 (Down)" in netdev
    _ok("ibdev2netdev", netdev)
    with pytest.raises(perf.ToolFailure, match="state is Down"):
        _bw(profile, faults, "mlx5_3")
    assert _ok("perftest", _bw(profile, faults, "mlx5_2")).data["rows"][0]["bw_average"] > 375


def test_ib_rate() -> None:
    profile = _profile(H100)
    faults = _faults("ib_rate=mlx5_5:200")
    cas = _ok("ibstat", ib.ibstat(profile, faults, NODE)).data["cas"]
    assert cas["mlx5_5"]["ports"]["1"]["rate"] == 200
    assert cas["mlx5_4"]["ports"]["1"]["rate"] == 400
    average = _ok("perftest", _bw(profile, faults, "mlx5_5")).data["rows"][0]["bw_average"]
    assert average == pytest.approx(391.8 / 2, rel=0.001)


def test_nccl_slow_and_slow_node() -> None:
    profile = _profile(H100)
    slow = _ok("nccl", _nccl(profile, _faults("nccl_slow=0.5"))).data
    assert slow["rows"][-1]["out_of_place"]["busbw"] == pytest.approx(482.5 / 2, rel=0.02)
    node = _faults("slow_node=0.8")
    assert _ok("nccl", _nccl(profile, node)).data["rows"][-1]["out_of_place"][
        "busbw"
    ] == pytest.approx(482.5 * 0.8, rel=0.02)
    bw = _ok("perftest", _bw(profile, node)).data["rows"][0]["bw_average"]
    assert bw == pytest.approx(391.8 * 0.8, rel=0.001)


def test_nccl_wrong() -> None:
    data = _ok("nccl", _nccl(_profile(H100), _faults("nccl_wrong=7"))).data
    assert data["rows"][-1]["out_of_place"]["wrong"] == 7
    assert data["out_of_bounds"] > 0
    assert data["out_of_bounds_ok"] is False
    assert data["rows"][0]["out_of_place"]["wrong"] == 0


@pytest.mark.parametrize("assignment", ["fabricmanager_failed", "fabricmanager_version=535.104.05"])
def test_fabric_manager_faults(assignment: str) -> None:
    profile = _profile(H100)
    faults = _faults(assignment)
    text, status = fabric.systemctl_status(profile, faults, NODE)
    assert status == 3
    assert _ok("fabricmanager", text).data["active"] is False
    gpus = _ok("smi-q", nvsmi.query(profile, faults, NODE)).data["gpus"]
    assert {g["fabric"]["state"] for g in gpus} == {"In Progress"}
    with pytest.raises(perf.ToolFailure, match="system not yet initialized"):
        _nccl(profile, faults)
    diag, diag_status = dcgm.diag(profile, faults, NODE, 1)
    assert diag_status != 0
    assert _ok("dcgm-diag", diag).data["overall"] == "Fail"
    if "version" in assignment:
        assert fabric.version_text(profile, faults) == "Fabric Manager version is : 535.104.05\n"
    # no NVSwitch, no fabric manager: the fault changes nothing on a PCIe node
    l40s = _profile("l40s-pcie")
    assert _ok("nccl", _nccl(l40s, faults)).data["rows"]


def test_clocks_throttled() -> None:
    profile = _profile(H100)
    faults = _faults("clocks_throttled=6")
    gpus = _ok("smi-q", nvsmi.query(profile, faults, NODE)).data["gpus"]
    assert [g["clocks_event_reasons"]["hw_slowdown"] for g in gpus].count(True) == 1
    assert gpus[6]["clocks_event_reasons"]["hw_slowdown"] is True
    field = "clocks_event_reasons.active"
    values = _ok("smi-csv", nvsmi.query_csv(profile, faults, NODE, [field])).data["values"]
    assert values[6][field] == "0x0000000000000008"
    text, status = dcgm.diag(profile, faults, NODE, 3)
    assert status != 0
    assert _ok("dcgm-diag", text).data["summary"]["Fail"] >= 1


def test_firmware() -> None:
    profile = _profile(H100)
    faults = _faults("firmware=gpu4=96.00.30.00.01,mlx5_0=28.39.1002")
    gpus = _ok("smi-q", nvsmi.query(profile, faults, NODE)).data["gpus"]
    assert [g["vbios_version"] for g in gpus].count("96.00.30.00.01") == 1
    assert gpus[4]["vbios_version"] == "96.00.30.00.01"
    cas = _ok("ibstat", ib.ibstat(profile, faults, NODE)).data["cas"]
    assert cas["mlx5_0"]["firmware_version"] == "28.39.1002"
    assert cas["mlx5_1"]["firmware_version"] == "28.43.1014"
    every = _faults("firmware=hca=28.39.1002")
    cas = _ok("ibstat", ib.ibstat(profile, every, NODE)).data["cas"]
    assert {ca["firmware_version"] for ca in cas.values()} == {"28.39.1002"}


# ------------------------------------------------------------------------------------------
# nvidia-smi -q -x: the same facts as -q, in the XML layout of a real 590 (DTD v13) capture

# the lab installs R570, whose -q -x is DTD v12 (docs/validate.md, "Tool versions gpuctl reads")
XML_CAPTURE = ROOT / "tests/fixtures/nvidia-smi/nvsmi-q-x-rtx3060-1gpu-570.txt"
# What the v13 XML prints that the 565 -q text layout does not (both parse to the same data
# everywhere else): the XML has these, the text gives None / leaves them out.
_XML_ONLY = {
    ("ecc", "channel_repair_pending"),
    ("ecc", "tpc_repair_pending"),
    ("power", "average_draw_w"),
    ("power", "instant_draw_w"),
    ("fabric", "health"),
    ("pcie", "device_id"),  # "0x2330..." in the text, "2330..." in the XML, as nvidia-smi prints
}
XML_FAULTS = [(name, "") for name in PROFILES] + [
    (H100, "gpu_lost=3"),
    (H100, "ecc=1:4"),
    (H100, "pcie_degraded=2:8:4"),
    (H100, "clocks_throttled=6"),
    (H100, "fabricmanager_failed"),
    ("l40s-pcie", "ecc=0:2"),
]


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    out["gpus"] = []
    for gpu in data["gpus"]:
        gpu = {k: dict(v) if isinstance(v, dict) else v for k, v in gpu.items()}
        for section, key in _XML_ONLY:
            if isinstance(gpu.get(section), dict):
                gpu[section].pop(key, None)
        out["gpus"].append(gpu)
    return out


def _gpu_tags(xml: str) -> list[str]:
    """The child elements of the first <gpu>, in order (read from the tab indentation)."""
    first = xml[xml.index("\t<gpu id=") : xml.index("\t</gpu>")]
    return re.findall(r"^\t\t<([A-Za-z_]+)>", first, re.MULTILINE)


@pytest.mark.parametrize(("name", "fault"), XML_FAULTS)
def test_nvidia_smi_xml_agrees_with_q(name: str, fault: str) -> None:
    profile = _profile(name)
    faults = _faults(fault) if fault else {}
    stamp = "Tue Dec 30 09:46:54 2025"
    xml = nvsmi_xml.query_xml(profile, faults, NODE, timestamp=stamp)
    text = nvsmi.query(profile, faults, NODE, timestamp=stamp)
    x, q = _ok("smi-xml", xml).data, _ok("smi-q", text).data
    assert _comparable(x) == _comparable(q)
    # the keys the task names, spelled out
    assert x["attached_gpus"] == q["attached_gpus"] == len(x["gpus"])
    for key in ("driver_version", "cuda_version"):
        assert x[key] == q[key] == profile[key]
    for gx, gq in zip(x["gpus"], q["gpus"], strict=True):
        for key in ("name", "pci_bus_id", "serial", "uuid", "remapped_rows", "fabric"):
            if key == "fabric":
                assert {k: gx[key][k] for k in ("state", "status")} == {
                    k: gq[key][k] for k in ("state", "status")
                }
            else:
                assert gx[key] == gq[key]
        assert gx["ecc"]["volatile"] == gq["ecc"]["volatile"]
        assert gx["ecc"]["aggregate"] == gq["ecc"]["aggregate"]
        assert gx["clocks_event_reasons"] == gq["clocks_event_reasons"]
        for key in ("gen_current", "gen_max", "width_current", "width_max"):
            assert gx["pcie"][key] == gq["pcie"][key]
    # the layout of the real capture: the DOCTYPE and root lines (the capture's XML declaration
    # line was re-saved by its publisher), tabs, and the <gpu> children in its order
    real = capture_output(XML_CAPTURE)
    assert xml.splitlines()[1:3] == real.splitlines()[1:3]
    assert xml.splitlines()[3].startswith("\t<timestamp>")
    assert _gpu_tags(xml) == _gpu_tags(real)


def test_nvidia_smi_xml_faults() -> None:
    profile = _profile(H100)
    lost = _ok("smi-xml", nvsmi_xml.query_xml(profile, _faults("gpu_lost=3"), NODE)).data
    assert lost["attached_gpus"] == 7
    assert "00000000:5D:00.0" not in [g["pci_bus_id"] for g in lost["gpus"]]
    ecc = _ok("smi-xml", nvsmi_xml.query_xml(profile, _faults("ecc=1:4"), NODE)).data["gpus"]
    assert ecc[1]["ecc"]["volatile"]["dram_uncorrectable"] == 4
    assert ecc[1]["ecc"]["aggregate"]["dram_uncorrectable"] == 4
    assert ecc[1]["remapped_rows"]["pending"] is True
    assert ecc[0]["remapped_rows"]["pending"] is False
    pcie = nvsmi_xml.query_xml(profile, _faults("pcie_degraded=2:8:4"), NODE)
    gpu = _ok("smi-xml", pcie).data["gpus"][2]
    want = {"gen_current": 4, "gen_max": 5, "width_current": 8, "width_max": 16}
    assert {key: gpu["pcie"][key] for key in want} == want
    slow = nvsmi_xml.query_xml(profile, _faults("clocks_throttled=6"), NODE)
    gpus = _ok("smi-xml", slow).data["gpus"]
    assert [g["clocks_event_reasons"]["hw_slowdown"] for g in gpus].count(True) == 1
    assert gpus[6]["clocks_event_reasons"]["hw_slowdown"] is True
    fm = nvsmi_xml.query_xml(profile, _faults("fabricmanager_failed"), NODE)
    assert {g["fabric"]["state"] for g in _ok("smi-xml", fm).data["gpus"]} == {"In Progress"}


def test_nvidia_smi_xml_escapes_text() -> None:
    profile = _profile("single-gpu")
    profile["gpus"]["name"] = "NVIDIA <A&B>"
    xml = nvsmi_xml.query_xml(profile, {}, NODE)
    assert "NVIDIA &lt;A&amp;B&gt;" in xml
    assert _ok("smi-xml", xml).data["gpus"][0]["name"] == "NVIDIA <A&B>"


def test_every_fault_is_tested() -> None:
    tested = {
        "gpu_lost", "xid", "ecc", "nvlink_degraded", "pcie_degraded", "ib_port_down", "ib_rate",
        "nvlink_errors",  # tests/unit/test_nvlink_errors.py
        "ib_link_flaps",  # tests/unit/test_ib_port_errors.py
        "ib_ber",  # tests/unit/test_link_phy.py
        "nccl_collective_slow",  # tests/unit/test_nccl_collectives.py
        "pcie_copy_slow",  # tests/unit/test_pcie_copies.py
        "pcie_aer",  # tests/unit/test_pcie_aer.py
        "pcie_acs", "nic_pcie_degraded",  # tests/unit/test_pci_tree.py
        "p2p_slow",  # tests/unit/test_p2p_copies.py
        "p2p_disabled",  # tests/unit/test_p2p_capability.py
        "gpudirect_broken",  # tests/unit/test_gpudirect.py, tests/unit/test_collect.py
        "ib_latency",  # tests/unit/test_latency.py
        "nic_slots_swapped",  # tests/unit/test_topology_shapes.py
        "roce_errors",  # tests/unit/test_roce_counters.py
        "thermal_throttle", "nccl_drift",  # tests/unit/test_burn.py
        "nccl_slow", "nccl_wrong", "fabricmanager_failed", "fabricmanager_version",
        "clocks_throttled", "slow_node", "firmware",
        # no_reboot acts in the lab's node supervisor, not in a tool's output: it is tested in
        # tests/lab/test_lab_packages.py (a reboot that never comes back)
        "no_reboot",
        # fw_update_fails acts in the lab's simulated BMC: tested in tests/unit/test_lab_sim_bmc.py
        "fw_update_fails",
    }  # fmt: skip
    assert set(NAMES) == tested


# ------------------------------------------------------------------------------------------
# The stand-in entry point, as a node runs it


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    profile = tmp_path / "hardware.json"
    profile.write_text(profiles.profile_json(H100))
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(_faults("ib_port_down=mlx5_3")))
    return {
        "GPUCTL_SIM_PROFILE": str(profile),
        "GPUCTL_SIM_FAULTS": str(faults),
        "GPUCTL_SIM_NODE": NODE,
        "PATH": "/usr/bin:/bin",
    }


def _standin(env: dict[str, str], tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from gpuctl.lab.sim.standin import main; "
        "sys.exit(main(sys.argv[1], sys.argv[2:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, f"/usr/bin/{tool}", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_standin_subprocess(node_env: dict[str, str]) -> None:
    smi = _standin(node_env, "nvidia-smi")
    assert smi.returncode == 0, smi.stderr
    assert _ok("smi-table", smi.stdout).data["gpu_count"] == 8

    q = _standin(node_env, "nvidia-smi", "-q")
    assert q.returncode == 0
    assert _ok("smi-q", q.stdout).data["attached_gpus"] == 8

    one = _standin(node_env, "nvidia-smi", "-q", "-i", "2")
    assert _ok("smi-q", one.stdout).data["gpus"][0]["pci_bus_id"] == "00000000:3A:00.0"

    csv = _standin(node_env, "nvidia-smi", "--query-gpu=name,memory.total", "--format=csv")
    assert csv.returncode == 0
    assert _ok("smi-csv", csv.stdout).data["values"][0]["memory.total [MiB]"] == 81559

    bad = _standin(node_env, "nvidia-smi", "--bogus")
    assert bad.returncode == 2
    assert "Invalid combination of input arguments" in bad.stdout
    bad_field = _standin(node_env, "nvidia-smi", "--query-gpu=nonsense", "--format=csv")
    assert bad_field.returncode == 2

    topo = _standin(node_env, "nvidia-smi", "topo", "-m")
    assert topo.returncode == 0
    _ok("topo", topo.stdout)
    nvl = _standin(node_env, "nvidia-smi", "nvlink", "-s")
    assert nvl.returncode == 0
    _ok("nvlink", nvl.stdout)

    ibstat = _standin(node_env, "ibstat")
    assert ibstat.returncode == 0
    cas = _ok("ibstat", ibstat.stdout).data["cas"]
    assert cas["mlx5_3"]["ports"]["1"]["state"] == "Down"
    missing = _standin(node_env, "ibstat", "mlx5_9")
    assert missing.returncode == 255
    assert "ibpanic" in missing.stderr

    nccl = _standin(node_env, "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8")
    assert nccl.returncode == 0, nccl.stderr
    rows = _ok("nccl", nccl.stdout).data["rows"]
    assert rows[-1]["size"] == GIB8
    assert _standin(node_env, "all_reduce_perf", "--bogus").returncode == 1

    # no server listening: the client gives up with perftest's error (two-process runs below)
    client = _standin(
        {**node_env, "GPUCTL_SIM_CONNECT_TIMEOUT": "0.5"},
        *("ib_write_bw", "-d", "mlx5_0", "-s", "8M", "--report_gbits", "-p", "1", "127.0.0.1"),
    )
    assert client.returncode == 1, client.stdout
    assert "Couldn't connect to 127.0.0.1:1" in client.stderr
    down = _standin(node_env, "ib_write_bw", "-d", "mlx5_3", "--report_gbits", "n2")
    assert down.returncode == 1
    assert "state is Down" in down.stderr

    diag = _standin(node_env, "dcgmi", "diag", "-r", "2")
    assert diag.returncode == 0
    assert _ok("dcgm-diag", diag.stdout).data["overall"] == "Pass"
    assert _standin(node_env, "ibv_devinfo").returncode == 0
    assert _standin(node_env, "ibdev2netdev").returncode == 0
    assert _standin(node_env, "nv-fabricmanager", "--version").stdout.startswith("Fabric Manager")


def test_standin_in_process(node_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    for key, value in node_env.items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    assert standin.main("/usr/bin/dmesg", ["--time-format", "iso"], out, err) == 0
    assert _ok("xid", out.getvalue()).data["counts"] == {}
    assert standin.main("/usr/bin/setpci", [], out, err) == 127
    for args in (["-q", "-x"], ["-x", "-q"], ["--query", "--xml-format"]):
        out = io.StringIO()
        assert standin.main("/usr/bin/nvidia-smi", args, out, err) == 0
        assert _ok("smi-xml", out.getvalue()).data["attached_gpus"] == 8
    out = io.StringIO()
    assert standin.main("/usr/bin/nvidia-smi", ["-q", "-x", "-i", "2"], out, err) == 0
    one = _ok("smi-xml", out.getvalue()).data
    assert one["gpus"][0]["pci_bus_id"] == "00000000:3A:00.0"
    assert len(one["gpus"]) == 1
    assert standin.main("/usr/bin/nvidia-smi", ["-x"], io.StringIO(), err) == 2
    monkeypatch.setenv("GPUCTL_SIM_PROFILE", "/nonexistent/hardware.json")
    assert standin.main("nvidia-smi", [], out, err) == 2
    assert "cannot read the simulated hardware" in err.getvalue()


def test_standin_faulty_node(tmp_path: Path) -> None:
    profile = tmp_path / "hardware.json"
    profile.write_text(profiles.profile_json(H100))
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(_faults("nccl_wrong=3", "gpu_lost=7")))
    env = {"GPUCTL_SIM_PROFILE": str(profile), "GPUCTL_SIM_FAULTS": str(faults), "PATH": "/bin"}
    wrong = _standin(env, "all_reduce_perf", "-b", "1M", "-e", "8M", "-g", "7")
    assert wrong.returncode == 1
    assert _ok("nccl", wrong.stdout).data["out_of_bounds_ok"] is False
    too_many = _standin(env, "all_reduce_perf", "-g", "8")
    assert too_many.returncode == 1
    faults.write_text(json.dumps({"gpu_exploded": True}))
    assert _standin(env, "nvidia-smi").returncode == 2


def test_sim_imports_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for path in (ROOT / "gpuctl/lab/sim").glob("*.py"):
        if path.name == "profiles.py":
            continue  # the repo side (reads YAML); never copied into a node's stand-in path
        for line in path.read_text().splitlines():
            words = line.split()
            if line.startswith(("import ", "from ")) and not words[1].startswith("."):
                assert words[1].split(".")[0] in allowed, (path.name, line)


# ------------------------------------------------------------------------------------------
# ib_write_bw across two processes: server (no host) and client (HOST) over TCP


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _side(tmp_path: Path, name: str, *faults: str) -> dict[str, str]:
    return sim_node_env(tmp_path, name, H100, *faults)


_CODE = STANDIN_CODE


def _pair(
    server_env: dict[str, str], client_env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """Run the server in the background and the client against it; both results."""
    return standin_pair("ib_write_bw", server_env, client_env, *args)


def test_ib_write_bw_server_and_client(tmp_path: Path) -> None:
    args = ("-d", "mlx5_0", "-s", "8M", "--report_gbits")
    server, client = _pair(_side(tmp_path, "n1"), _side(tmp_path, "n2"), *args)
    assert server.returncode == 0, server.stderr
    assert client.returncode == 0, client.stderr
    srv = _ok("perftest", server.stdout).data
    cli = _ok("perftest", client.stdout).data
    assert (srv["role"], cli["role"]) == ("server", "client")
    expected = _profile(H100)["expected"]["ib_write_bw_gbps"]
    for data in (srv, cli):
        assert data["bw_unit"] == "Gb/sec"
        assert data["rows"][0]["bytes"] == 8 << 20
        assert data["rows"][0]["bw_average"] == pytest.approx(expected, rel=0.001)


@pytest.mark.parametrize("slow_side", ["server", "client"])
def test_ib_write_bw_slower_side_limits_both(tmp_path: Path, slow_side: str) -> None:
    slow = _side(tmp_path, "slow", "ib_rate=mlx5_0:200")
    fast = _side(tmp_path, "fast")
    envs = (slow, fast) if slow_side == "server" else (fast, slow)
    server, client = _pair(*envs, "-d", "mlx5_0", "-s", "8M", "--report_gbits")
    assert (server.returncode, client.returncode) == (0, 0), server.stderr + client.stderr
    expected = _profile(H100)["expected"]["ib_write_bw_gbps"] / 2
    for result in (server, client):
        average = _ok("perftest", result.stdout).data["rows"][0]["bw_average"]
        assert average == pytest.approx(expected, rel=0.001)


def test_ib_write_bw_port_down_on_the_client_fails_both(tmp_path: Path) -> None:
    down = _side(tmp_path, "down", "ib_port_down=mlx5_0")
    port = str(_free_port())
    up = _side(tmp_path, "up")
    srv = subprocess.Popen(
        [sys.executable, "-c", _CODE, "/usr/bin/ib_write_bw", "-d", "mlx5_0", "-p", port],
        env=up,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert srv.stdout is not None
        assert "Waiting for client" in "".join(srv.stdout.readline() for _ in range(3))
        client = _standin(down, "ib_write_bw", "-d", "mlx5_0", "-p", port, "127.0.0.1")
        _, err = srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    assert client.returncode == 1
    assert "state is Down" in client.stderr
    assert srv.returncode == 1  # told by the client, the server fails too
    assert "Unable to Connect the HCA's through the link" in err


def test_ib_write_bw_port_down_on_the_server_fails_both(tmp_path: Path) -> None:
    # down from the start: the server fails before listening, the client cannot connect
    down = _side(tmp_path, "down", "ib_port_down=mlx5_0")
    client_env = {**_side(tmp_path, "up"), "GPUCTL_SIM_CONNECT_TIMEOUT": "1"}
    server, client = _pair(down, client_env, "-d", "mlx5_0", "--report_gbits")
    assert server.returncode == 1
    assert "state is Down" in server.stderr
    assert client.returncode == 1
    assert "Couldn't connect" in client.stderr


def test_ib_write_bw_port_goes_down_while_the_server_waits(tmp_path: Path) -> None:
    server_env = _side(tmp_path, "srv")
    port = str(_free_port())
    srv = subprocess.Popen(
        [sys.executable, "-c", _CODE, "/usr/bin/ib_write_bw", "-d", "mlx5_0", "-p", port],
        env=server_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert srv.stdout is not None
        assert "Waiting for client" in "".join(srv.stdout.readline() for _ in range(3))
        Path(server_env["GPUCTL_SIM_FAULTS"]).write_text(json.dumps(_faults("ib_port_down=mlx5_0")))
        client = _standin(_side(tmp_path, "cli"), "ib_write_bw", "-d", "mlx5_0", "-p", port,
                          "127.0.0.1")  # fmt: skip
        _, err = srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    assert srv.returncode == 1
    assert "state is Down" in err
    assert client.returncode == 1
    assert "Unable to Connect the HCA's through the link" in client.stderr
    failed = parse("perftest", client.stderr + client.stdout)
    assert not failed.recognised
    assert "Failed to modify QP to RTR" in failed.problems[0]


# ------------------------------------------------------------------------------------------
# Device nodes and modprobe (the kernel module stand-in)


def test_device_nodes_follow_the_gpu_count() -> None:
    from gpuctl.lab.sim import devices

    nodes = devices.device_nodes(8)
    assert [n for n in nodes if n[0].startswith("nvidia") and n[0][6:].isdigit()] == [
        (f"nvidia{i}", 195, i) for i in range(8)
    ]
    assert ("nvidiactl", 195, 255) in nodes
    assert ("nvidia-uvm", devices.UVM_MAJOR, 0) in nodes
    assert devices.device_nodes(0) == []


@pytest.mark.skipif(sys.platform != "linux", reason="mknod of character devices is Linux")
def test_device_script_makes_char_devices_and_answers_modprobe(tmp_path: Path) -> None:
    import os
    import stat

    if os.geteuid() != 0:
        pytest.skip("mknod of character devices needs root")
    script = ROOT / "gpuctl" / "lab" / "sim" / "devices.py"
    dev = tmp_path / "dev"
    dev.mkdir()
    hw = tmp_path / "hardware.json"
    hw.write_text(profiles.profile_json("single-gpu"))
    env = {"GPUCTL_SIM_PROFILE": str(hw), "GPUCTL_SIM_DEV": str(dev), "PATH": "/usr/bin:/bin"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *args], env=env, capture_output=True, text=True
        )

    first = run()
    assert first.returncode == 0, first.stderr
    assert "nvidia0" in first.stdout
    st = (dev / "nvidia0").lstat()
    assert stat.S_ISCHR(st.st_mode)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 0)
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert not (dev / "nvidia1").exists()  # one GPU in this profile
    assert (os.major((dev / "nvidiactl").lstat().st_rdev)) == 195
    again = run()
    assert again.returncode == 0
    assert again.stdout == ""  # nothing left to create
    (dev / "nvidia0").unlink()
    assert run("modprobe", "nvidia").returncode == 0
    assert (dev / "nvidia0").exists()  # modprobe nvidia makes them, as the module would
    assert run("modprobe", "nvidia_peermem").returncode == 0
    assert run("modprobe", "nouveau").returncode == 1
    assert run("bogus").returncode == 2
    hw.unlink()  # a node without GPUs (a controller): nothing to make
    empty = tmp_path / "dev2"
    empty.mkdir()
    env["GPUCTL_SIM_DEV"] = str(empty)
    assert run().returncode == 0
    assert list(empty.iterdir()) == []
