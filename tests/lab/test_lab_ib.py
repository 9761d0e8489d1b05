"""InfiniBand stand-ins in lab nodes: Debian's package names from the lab repository, read by
gpuctl's parsers, and ib_write_bw between two nodes over the bridge (needs root).

The lab comes up with two compute nodes (gpu001, gpu002) once for the module and goes down at
its end.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from lab_helpers import LAB_APT_PROXY, sh

from gpuctl.lab import lab, repo
from gpuctl.lab.sim import profiles
from gpuctl.validation.parsing import parse

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]

APT = f"DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 {LAB_APT_PROXY}"
PACKAGES = "infiniband-diags ibverbs-utils perftest mlnx-tools"
NODES = ("gpu001", "gpu002")
SERVER = "gpu002"
CLIENT = "gpu001"
BW = "ib_write_bw -d mlx5_0 -s 8M --report_gbits"


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    lab.down()
    lab.up(2)
    yield {name: lab.address_of(name) for name in NODES}
    lab.down()


def ssh(address: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return sh(address, command, timeout=timeout)


def _expected_bw() -> float:
    return float(profiles.load(lab.DEFAULT_PROFILE)["expected"]["ib_write_bw_gbps"])


def _start_server(cluster: dict[str, str]) -> None:
    res = ssh(cluster[SERVER], f"rm -f /tmp/srv.txt; nohup {BW} < /dev/null > /tmp/srv.txt 2>&1 &")
    assert res.returncode == 0, res.stderr


def _server_output(cluster: dict[str, str]) -> str:
    return ssh(cluster[SERVER], "sleep 0.5; cat /tmp/srv.txt").stdout


def _ibstat(address: str) -> dict[str, dict[str, object]]:
    res = ssh(address, "ibstat")
    assert res.returncode == 0, res.stderr
    parsed = parse("ibstat", res.stdout)
    assert parsed.recognised, parsed.problems
    return {name: ca["ports"]["1"] for name, ca in parsed.data["cas"].items()}


def test_packages_install_under_debians_names(cluster: dict[str, str]) -> None:
    for name, address in cluster.items():
        install = f"apt-get -q {LAB_APT_PROXY} update && {APT} install {PACKAGES}"
        res = ssh(address, install, timeout=600)
        assert res.returncode == 0, (name, res.stdout[-2000:] + res.stderr[-2000:])
        policy = ssh(address, "apt-cache policy infiniband-diags perftest").stdout
        assert "Installed: 44.0-2+gpuctllab1" in policy, policy
        assert "Installed: 4.5+0.17-1+gpuctllab1" in policy, policy
        info = ssh(address, "dpkg-query -W -f=\\${Description} perftest").stdout
        assert repo.STANDIN_NOTICE in info
        for tool in ("ibstat", "ibv_devinfo", "ib_write_bw", "ibdev2netdev"):
            assert ssh(address, f"command -v {tool}").returncode == 0, (name, tool)


def test_ibstat_shows_eight_active_ndr_ports(cluster: dict[str, str]) -> None:
    for address in cluster.values():
        ports = _ibstat(address)
        assert len(ports) == 8
        assert {(p["state"], p["rate"]) for p in ports.values()} == {("Active", 400)}


def test_ib_write_bw_between_two_nodes(cluster: dict[str, str]) -> None:
    _start_server(cluster)
    client = ssh(cluster[CLIENT], f"{BW} {cluster[SERVER]}", timeout=60)
    assert client.returncode == 0, client.stdout + client.stderr
    result = parse("perftest", client.stdout)
    assert result.recognised, result.problems
    assert result.data["role"] == "client"
    assert result.data["rows"][0]["bw_average"] == pytest.approx(_expected_bw(), rel=0.01)
    server = parse("perftest", _server_output(cluster))
    assert server.recognised, server.problems
    assert server.data["role"] == "server"
    assert server.data["rows"][0]["bw_average"] == pytest.approx(_expected_bw(), rel=0.01)


def test_port_down_on_the_server_fails_the_client(cluster: dict[str, str]) -> None:
    lab.inject_fault(SERVER, "ib_port_down", "mlx5_0")
    try:
        assert _ibstat(cluster[SERVER])["mlx5_0"]["state"] == "Down"
        _start_server(cluster)
        client = ssh(cluster[CLIENT], f"{BW} {cluster[SERVER]}", timeout=60)
        assert client.returncode != 0, client.stdout
        assert "Couldn't connect" in client.stderr
        assert "state is Down" in _server_output(cluster)
    finally:
        lab.clear_faults(SERVER)
    assert _ibstat(cluster[SERVER])["mlx5_0"]["state"] == "Active"
    _start_server(cluster)
    client = ssh(cluster[CLIENT], f"{BW} {cluster[SERVER]}", timeout=60)
    assert client.returncode == 0, client.stdout + client.stderr
    assert parse("perftest", client.stdout).data["rows"][0]["bw_average"] == pytest.approx(
        _expected_bw(), rel=0.01
    )
