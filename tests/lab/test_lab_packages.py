"""Packages inside lab nodes, the way a real cluster gets them (needs root).

Debian packages come through the lab's apt proxy (apt-cacher-ng on the bridge address), the
NVIDIA stand-ins from the lab repository (http.server on the bridge address); the nodes keep no
route beyond the bridge. The lab comes up once for the module and goes down at its end.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from lab_helpers import LAB_APT_PROXY, sh

from gpuctl.lab import lab, repo
from gpuctl.lab.system import LabError
from gpuctl.validation.parsing import parse

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]

DRIVER = "nvidia-open"  # NVIDIA's metapackage name for the R570 open-module driver
APT = f"DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 {LAB_APT_PROXY}"
# nccl-tests from the lab's git mirror, built as on a real node (the nccl role does the same)
NCCL_TESTS_BUILD = (
    f"{APT} install --no-install-recommends libnccl-dev cuda-nvcc-12-8 git make && "
    f"git clone -q --branch v2.17.9 {repo.git_url('nccl-tests')} /opt/nccl-tests && "
    "make -C /opt/nccl-tests CUDA_HOME=/usr/local/cuda-12.8 NCCL_HOME=/usr && "
    "ln -sf /opt/nccl-tests/build/all_reduce_perf /usr/local/bin/all_reduce_perf"
)


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    lab.down()
    result = lab.up(1)
    yield result.status.nodes[-1].address  # gpu001
    lab.down()


def ssh(address: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return sh(address, command, timeout=timeout)


def _refused(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) != 0


def test_servers_listen_on_the_bridge_address_only(node: str) -> None:
    for svc in repo.SERVICES:
        assert repo.service_pid(svc) is not None, svc.name
        assert not _refused(repo.HOST_ADDRESS, svc.port)
        assert _refused("127.0.0.1", svc.port)  # bound to 198.18.0.1, not to every address


def test_apt_update_and_munge_through_the_proxy(node: str) -> None:
    res = ssh(node, f"apt-get -q {LAB_APT_PROXY} update && {APT} install munge")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    res = ssh(node, "munge -n | unmunge")
    assert "STATUS:" in res.stdout
    assert "Success" in res.stdout, res.stdout + res.stderr
    cached = list(repo.cache_dir().rglob("munge_*.deb"))
    assert cached, "the proxy did not cache the package it served"


def test_driver_installs_from_the_lab_repository(node: str) -> None:
    res = ssh(node, f"{APT} install {DRIVER}")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    res = ssh(node, f"apt-cache policy {DRIVER}")
    assert "Installed: 570.172.08-1" in res.stdout, res.stdout
    assert "http://198.18.0.1:8081 ./ Packages" in res.stdout
    info = ssh(node, "dpkg-query -W -f=\\${Description} nvidia-smi").stdout
    assert repo.STANDIN_NOTICE in info
    assert ssh(node, "test -x /usr/bin/nvidia-smi").returncode == 0


def test_nvidia_smi_runs(node: str) -> None:
    res = ssh(node, "nvidia-smi")
    assert res.returncode == 0, res.stdout + res.stderr


def test_fabric_manager_is_a_real_systemd_service(node: str) -> None:
    res = ssh(
        node, f"{APT} install nvidia-fabricmanager-570 && systemctl start nvidia-fabricmanager"
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    res = ssh(node, "systemctl status nvidia-fabricmanager")
    assert "Active: active (running)" in res.stdout, res.stdout + res.stderr


def _smi_q(node: str) -> dict[str, Any]:
    res = ssh(node, "nvidia-smi -q")
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-1000:]
    parsed = parse("smi-q", res.stdout)
    assert parsed.recognised, parsed.problems
    return parsed.data


def test_simulated_hgx_h100_through_the_real_parsers(node: str) -> None:
    data = _smi_q(node)
    assert data["driver_version"] == "570.172.08"
    assert [g["name"] for g in data["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    topo = parse("topo", ssh(node, "nvidia-smi topo -m").stdout)
    assert topo.recognised, topo.problems
    assert topo.data["links"]["GPU0"]["GPU7"] == "NV18"
    res = ssh(node, NCCL_TESTS_BUILD)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run = ssh(node, "all_reduce_perf -b 8 -e 8G -f 2 -g 8")
    nccl = parse("nccl", run.stdout)
    assert nccl.recognised, (nccl.problems, run.returncode, run.stderr[-1000:])
    assert nccl.data["avg_busbw"] is not None


def test_faults_show_in_the_tools_and_survive_reboot(node: str) -> None:
    lab.inject_fault("gpu001", "gpu_lost", "3")
    assert len(_smi_q(node)["gpus"]) == 7
    kernel = parse("xid", ssh(node, "journalctl -t kernel --no-pager -o short").stdout)
    assert 79 in [e["xid"] for e in kernel.data["events"]]
    assert kernel.data["fallen_off_bus"]
    lab.inject_fault("gpu001", "nccl_wrong", "5")
    nccl = parse("nccl", ssh(node, "all_reduce_perf -b 8 -e 8G -f 2 -g 7").stdout)
    assert any((r["out_of_place"]["wrong"] or 0) > 0 for r in nccl.data["rows"])
    lab.reboot("gpu001")
    assert len(_smi_q(node)["gpus"]) == 7  # the fault lives on the node's disk
    kernel = parse("xid", ssh(node, "journalctl -t kernel --no-pager -o short").stdout)
    assert 79 in [e["xid"] for e in kernel.data["events"]]  # and so does its kernel log line
    lab.clear_faults("gpu001")
    assert len(_smi_q(node)["gpus"]) == 8
    assert lab.faults_of("gpu001") == {}


def test_a_node_that_does_not_come_back_after_reboot(node: str) -> None:
    lab.inject_fault("gpu001", "no_reboot")
    with pytest.raises(LabError, match="did not come back"):
        lab.reboot("gpu001", timeout=15)
    assert {n.name: n.state for n in lab.status().nodes}["gpu001"] == "stopped"
    lab.clear_faults("gpu001")
    again = lab.up(1)  # like powering the machine on again
    assert again.started == ("gpu001",)
    assert ssh(node, "true").returncode == 0


def _ibstat(node: str) -> dict[str, Any]:
    res = ssh(node, "ibstat")
    parsed = parse("ibstat", res.stdout)
    assert parsed.recognised, parsed.problems
    cas: dict[str, Any] = parsed.data["cas"]
    return cas


def _busbw(node: str) -> float:
    run = ssh(node, "all_reduce_perf -b 8 -e 8G -f 2 -g 8")
    value = parse("nccl", run.stdout).data["avg_busbw"]
    assert isinstance(value, float), run.stdout[-500:]
    return value


def _kernel_xids(node: str) -> list[int]:
    out = ssh(node, "journalctl -t kernel --no-pager -o short").stdout
    return [e["xid"] for e in parse("xid", out).data["events"]]


def _fm_active(node: str) -> bool | None:
    ssh(node, "systemctl restart nvidia-fabricmanager")
    status = parse("fabricmanager", ssh(node, "systemctl status nvidia-fabricmanager").stdout)
    active: bool | None = status.data["active"]
    return active


# fault, value, what shows it through gpuctl's own parsers (called with the node address)
FAULT_EFFECTS: list[tuple[str, str, Any]] = [
    ("ecc", "2:5", lambda n: _smi_q(n)["gpus"][2]["remapped_rows"]["pending"] is True),
    ("pcie_degraded", "1:8:4", lambda n: _smi_q(n)["gpus"][1]["pcie"]["width_current"] == 8),
    (
        "clocks_throttled",
        "all",
        lambda n: _smi_q(n)["gpus"][0]["clocks_event_reasons"].get("hw_slowdown") is True,
    ),
    (
        "nvlink_degraded",
        "0-1:2",
        lambda n: (
            parse("topo", ssh(n, "nvidia-smi topo -m").stdout).data["links"]["GPU0"]["GPU1"]
            == "NV16"
        ),
    ),
    ("xid", "13:0", lambda n: 13 in _kernel_xids(n)),
    ("ib_rate", "mlx5_1:200", lambda n: _ibstat(n)["mlx5_1"]["ports"]["1"]["rate"] == 200),
    ("ib_port_down", "mlx5_2", lambda n: _ibstat(n)["mlx5_2"]["ports"]["1"]["state"] == "Down"),
    (
        "firmware",
        "hca=28.39.1002",
        lambda n: _ibstat(n)["mlx5_0"]["firmware_version"] == "28.39.1002",
    ),
    ("nccl_slow", "0.5", lambda n: _busbw(n) < 0.6 * BASELINE["busbw"]),
    ("slow_node", "0.5", lambda n: _busbw(n) < 0.6 * BASELINE["busbw"]),
    ("fabricmanager_failed", "", lambda n: _fm_active(n) is False),
    (
        "fabricmanager_version",
        "570.124.06",
        lambda n: "570.124.06" in ssh(n, "nv-fabricmanager --version").stdout,
    ),
]
BASELINE: dict[str, float] = {}


def test_every_other_fault_shows_in_the_node_and_clears(node: str) -> None:
    res = ssh(node, f"{APT} install infiniband-diags")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    BASELINE["busbw"] = _busbw(node)
    for fault, value, shows in FAULT_EFFECTS:
        assert not shows(node), f"{fault} shows before it was injected"
        lab.inject_fault("gpu001", fault, value)
        assert shows(node), f"{fault} {value} does not show"
        lab.clear_faults("gpu001")
        if fault != "xid":  # a kernel log keeps its lines, like a real one
            assert not shows(node), f"{fault} still shows after --clear"


def test_firmware_tools_from_the_lab_repository(node: str) -> None:
    res = ssh(node, f"{APT} install mft")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    query = parse("mlxfwmanager", ssh(node, "mlxfwmanager --query").stdout)
    assert query.recognised, query.problems
    assert len(query.data["devices"]) == 8
    before = {d["versions"]["FW"]["current"] for d in query.data["devices"]}
    lab.inject_fault("gpu001", "firmware", "hca=28.39.1002")
    query = parse("mlxfwmanager", ssh(node, "mlxfwmanager --query").stdout)
    assert {d["versions"]["FW"]["current"] for d in query.data["devices"]} == {"28.39.1002"}
    flint = parse("flint-query", ssh(node, "flint -d mlx5_0 query").stdout)
    assert flint.data["fw_version"] == "28.39.1002"
    lab.clear_faults("gpu001")
    query = parse("mlxfwmanager", ssh(node, "mlxfwmanager --query").stdout)
    assert {d["versions"]["FW"]["current"] for d in query.data["devices"]} == before


def test_unknown_fault_is_a_clear_error() -> None:
    with pytest.raises(LabError, match="unknown fault"):
        lab.inject_fault("gpu001", "gpu_on_fire", "1")


def test_node_still_has_no_default_route(node: str) -> None:
    routes = ssh(node, "ip route; ip -6 route").stdout
    assert "default" not in routes
    # the lab gives a node no proxy: Debian is reached only through the proxy a test (or
    # cluster.yml's package_sources, at provisioning) names; the lab repository directly
    res = ssh(node, "apt-config dump | grep -ci proxy || true")
    assert res.stdout.strip() == "0", res.stdout
    alone = ssh(node, "timeout 60 apt-get -q update 2>&1")
    assert "Failed to fetch http://deb.debian.org" in alone.stdout or "Could not" in alone.stdout


def test_down_stops_both_servers(node: str) -> None:
    lab.down()
    # no connect test: without the bridge, 198.18.0.1 is routed off this machine
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    for svc in repo.SERVICES:
        assert repo.service_pid(svc) is None
        assert f"{repo.HOST_ADDRESS}:{svc.port} " not in listening
    assert (repo.repo_dir() / "Packages").is_file()  # the caches stay
