"""NCCL on RoCE rides the lossless class.

The roce_qos role sets trust, PFC, ECN and RDMA-CM's ToS, but NCCL does not use RDMA-CM: it
sends with traffic class 0 unless NCCL_IB_TC is set ("NCCL_IB_TC: Defines the InfiniBand
traffic class field", default 0, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html),
and reads system-wide settings from /etc/nccl.conf (same page). So gpuctl render gives the nccl
role NCCL_IB_TC = dscp << 2 on RoCE nodes, the role writes /etc/nccl.conf, cluster.yml refuses a
DSCP whose default priority (dscp >> 3) is not the PFC priority, and the QoS script sets the DSCP
and priority of DCQCN's congestion notifications (ecn/roce_np/cnp_dscp, cnp_802p_prio: the
MLNX_OFED / DOCA-OFED "Explicit Congestion Notification (ECN)" sysfs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from helpers import ROOT
from test_roce_qos_script import Device, FakeHost, lines, render_conf

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.errors import ConfigError
from gpuctl.render import render_files

NCCL = ROOT / "playbooks" / "roles" / "nccl"
INVENTORIES = ROOT / "inventories"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _group_vars(path: Path) -> dict[str, dict[str, Any]]:
    files = render_files(load_cluster(path))
    return {
        k.removeprefix("group_vars/").removesuffix(".yml"): yaml.safe_load(v)
        for k, v in files.items()
        if k.startswith("group_vars/ng_")
    }


def _nccl_conf(conf: dict[str, Any]) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in text.splitlines())
    template = (NCCL / "templates" / "nccl.conf.j2").read_text()
    return env.from_string(template).render(ansible_managed="Ansible managed", nccl_conf=conf)


# ------------------------------------------------------------------------------------------
# render -> the nccl role


def test_roce_nodes_get_nccl_ib_tc_from_the_fabrics_dscp() -> None:
    groups = _group_vars(INVENTORIES / "a100-roce.yml")
    gpu = groups["ng_a100"]
    assert gpu["roce_qos_dscp"] == 26
    assert gpu["nccl_conf"] == {"NCCL_IB_TC": 26 << 2, "NCCL_IB_GID_INDEX": 3}
    # the same byte RDMA-CM gets from the roce_qos role
    tos = dict(
        line.split("=", 1)
        for line in render_conf(roce_qos_devices=["mlx5_0"]).splitlines()
        if line.startswith("ROCE_QOS_TOS=")
    )
    assert tos == {"ROCE_QOS_TOS": '"104"'}


def test_infiniband_nodes_get_no_traffic_class() -> None:
    for name in ("hgx-h100-ndr.yml", "lab.yml"):
        for group, hv in _group_vars(INVENTORIES / name).items():
            assert hv["nccl_conf"] == {}, (name, group)


def test_every_nccl_variable_render_writes_is_a_role_input() -> None:
    defaults = _yaml(NCCL / "defaults" / "main.yml")
    options = _yaml(NCCL / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert defaults["nccl_conf"] == {}
    assert options["nccl_conf"]["type"] == "dict"


def test_the_role_writes_etc_nccl_conf() -> None:
    (task,) = [t for t in _yaml(NCCL / "tasks" / "configure.yml") if "nccl.conf" in t["name"]]
    tpl = task["ansible.builtin.template"]
    assert tpl["src"] == "nccl.conf.j2"
    assert tpl["dest"] == "{{ __nccl_conf_path }}"
    assert _yaml(NCCL / "vars" / "main.yml")["__nccl_conf_path"] == "/etc/nccl.conf"
    assert tpl["mode"] == "0644"


def test_nccl_conf_holds_only_the_lines_that_apply() -> None:
    roce = _nccl_conf({"NCCL_IB_TC": 104})
    settings = [ln for ln in roce.splitlines() if ln and not ln.startswith("#")]
    assert settings == ["NCCL_IB_TC=104"]
    assert [ln for ln in _nccl_conf({}).splitlines() if ln and not ln.startswith("#")] == []


# ------------------------------------------------------------------------------------------
# cluster.yml: the DSCP must select the lossless priority


def _roce(dscp: int, pfc: int, trust: str = "dscp") -> str:
    text = (INVENTORIES / "a100-roce.yml").read_text()
    old = "      trust: dscp\n      pfc_priority: 3\n      dscp: 26\n"
    assert old in text
    return text.replace(
        old, f"      trust: {trust}\n      pfc_priority: {pfc}\n      dscp: {dscp}\n"
    )


@pytest.mark.parametrize(("dscp", "pfc"), [(26, 3), (24, 3), (31, 3), (40, 5), (0, 0)])
def test_a_dscp_of_the_pfc_priority_loads(dscp: int, pfc: int) -> None:
    load_cluster_text(_roce(dscp, pfc), "c")


@pytest.mark.parametrize(("dscp", "pfc"), [(34, 3), (26, 4), (46, 3)])
def test_a_dscp_of_another_priority_is_refused(dscp: int, pfc: int) -> None:
    with pytest.raises(ConfigError) as err:
        load_cluster_text(_roce(dscp, pfc), "c")
    text = str(err.value)
    assert "qos.dscp" in text
    assert f"dscp {dscp} maps to priority {dscp >> 3}" in text
    assert f"not pfc_priority {pfc}" in text
    assert "lossy class" in text


def test_with_pcp_trust_the_dscp_does_not_select_the_priority() -> None:
    load_cluster_text(_roce(34, 3, trust="pcp"), "c")


# ------------------------------------------------------------------------------------------
# the QoS script: congestion notifications


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def test_settings_carry_the_cnp_class() -> None:
    conf = render_conf(roce_qos_devices=["mlx5_0"], roce_qos_cnp_dscp=40, roce_qos_cnp_priority=5)
    assert 'ROCE_QOS_CNP_DSCP="40"' in conf.splitlines()
    assert 'ROCE_QOS_CNP_PRIORITY="5"' in conf.splitlines()
    defaults = _yaml(ROOT / "playbooks" / "roles" / "roce_qos" / "defaults" / "main.yml")
    assert (defaults["roce_qos_cnp_dscp"], defaults["roce_qos_cnp_priority"]) == (48, 6)
    assert defaults["roce_qos_cnp_dscp"] >> 3 == defaults["roce_qos_cnp_priority"]


def test_check_reports_and_apply_sets_the_cnp_class(host: FakeHost) -> None:
    host.setup([Device(cnp_dscp=0, cnp_prio=0)])
    check = host.run("check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert lines(check.stdout, "drift:") == [
        "drift: mlx5_0 (eth0) ecn roce_np cnp_dscp is '0', wants '48'",
        "drift: mlx5_0 (eth0) ecn roce_np cnp_802p_prio is '0', wants '6'",
    ]
    applied = host.run("apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert len(lines(applied.stdout, "applied:")) == 2
    np = host.root / "sys" / "class" / "net" / "eth0" / "ecn" / "roce_np"
    assert (np / "cnp_dscp").read_text() == "48\n"
    assert (np / "cnp_802p_prio").read_text() == "6\n"
    again = host.run("check")
    assert again.returncode == 0, again.stdout


def test_no_cnp_sysfs_is_a_note_not_drift(host: FakeHost) -> None:
    host.setup([Device(ecn_sysfs=False)])
    res = host.run("check")
    assert res.returncode == 0, res.stdout + res.stderr
    assert any("no roce_np/cnp_dscp sysfs" in ln for ln in lines(res.stdout, "note:"))
