"""Rendering: golden files, determinism, real Ansible parsing the output, Slurm file details."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from helpers import ROOT

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.errors import RenderError
from gpuctl.render import MANIFEST, render_cluster, render_files
from gpuctl.resources import templates_dir
from gpuctl.starter import starter

GOLDEN_EXAMPLE = ROOT / "inventories" / "hgx-h100-ndr.yml"
GOLDEN_DIR = ROOT / "tests" / "golden" / "hgx-h100-ndr"
BIN = Path(sys.executable).parent


def _golden_files() -> dict[str, str]:
    return {
        str(p.relative_to(GOLDEN_DIR)): p.read_text(encoding="utf-8")
        for p in sorted(GOLDEN_DIR.rglob("*"))
        if p.is_file()
    }


def test_golden_render_of_hgx_example() -> None:
    """Pins every rendered file of one example. Update with GPUCTL_UPDATE_GOLDEN=1 after review."""
    files = render_files(load_cluster(GOLDEN_EXAMPLE))
    if os.environ.get("GPUCTL_UPDATE_GOLDEN") == "1":
        shutil.rmtree(GOLDEN_DIR, ignore_errors=True)
        for rel, text in files.items():
            target = GOLDEN_DIR / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    golden = _golden_files()
    assert sorted(files) == sorted(golden)
    for rel, text in files.items():
        assert text == golden[rel], f"{rel} differs from tests/golden (GPUCTL_UPDATE_GOLDEN=1)"


def test_render_is_deterministic_and_byte_identical(tmp_path: Path) -> None:
    cluster = load_cluster(GOLDEN_EXAMPLE)
    render_cluster(cluster, tmp_path / "a")
    # a fresh load in a fresh process must give the same bytes (no hash-order or time effects)
    code = (
        "import sys; from pathlib import Path; from gpuctl.config import load_cluster; "
        "from gpuctl.render import render_cluster; "
        "render_cluster(load_cluster(sys.argv[1]), Path(sys.argv[2]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run(
        [sys.executable, "-c", code, str(GOLDEN_EXAMPLE), str(tmp_path / "b")], check=True, env=env
    )
    a = {
        p.relative_to(tmp_path / "a"): p.read_bytes()
        for p in (tmp_path / "a").rglob("*")
        if p.is_file()
    }
    b = {
        p.relative_to(tmp_path / "b"): p.read_bytes()
        for p in (tmp_path / "b").rglob("*")
        if p.is_file()
    }
    assert a == b
    assert len(a) > 10


def test_rerender_removes_files_that_are_gone_and_keeps_the_operators(tmp_path: Path) -> None:
    hgx = load_cluster_text(starter("hgx-h100", 4), "hgx")
    ws = load_cluster_text(starter("workstation"), "ws")
    out = tmp_path / "out"
    (out / "host_vars").mkdir(parents=True)
    (out / "host_vars" / "gpu001.yml").write_text("my_override: 1\n", encoding="utf-8")
    render_cluster(hgx, out)
    assert (out / "slurm" / "topology.conf").is_file()
    assert (out / "group_vars" / "ng_hgx.yml").is_file()
    result = render_cluster(ws, out)
    assert set(result.removed) == {
        "slurm/topology.conf",
        "group_vars/ng_hgx.yml",
        "group_vars/ng_head.yml",
    }
    assert not (out / "slurm" / "topology.conf").exists()
    assert (out / "group_vars" / "ng_ws.yml").is_file()
    assert (out / "host_vars" / "gpu001.yml").read_text(encoding="utf-8") == "my_override: 1\n"
    assert (out / MANIFEST).read_text(encoding="utf-8").splitlines() == sorted(render_files(ws))


def test_unchanged_files_are_not_rewritten(tmp_path: Path) -> None:
    cluster = load_cluster(GOLDEN_EXAMPLE)
    render_cluster(cluster, tmp_path)
    conf = tmp_path / "slurm" / "slurm.conf"
    os.utime(conf, (1_000_000, 1_000_000))
    render_cluster(cluster, tmp_path)
    assert conf.stat().st_mtime == 1_000_000


def _ansible(tmp: Path, *args: str) -> str:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(tmp / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible-tmp"),
        "ANSIBLE_HOME": str(tmp / ".ah"),
    }
    proc = subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_real_ansible_reads_the_rendered_inventory_and_config(tmp_path: Path) -> None:
    render_cluster(load_cluster(GOLDEN_EXAMPLE), tmp_path)
    listing: dict[str, Any] = json.loads(_ansible(tmp_path, "ansible-inventory", "--list"))
    assert sorted(listing["role_compute"]["hosts"]) == ["gpu001", "gpu002", "gpu003", "gpu004"]
    assert sorted(listing["leaf_leaf01"]["hosts"]) == ["gpu001", "gpu002"]
    assert sorted(listing["nvswitch"]["hosts"]) == ["gpu001", "gpu002", "gpu003", "gpu004"]
    hostvars = listing["_meta"]["hostvars"]["gpu003"]
    assert hostvars["ansible_host"] == "10.0.1.3"
    assert hostvars["gpuctl_leaves"] == {"ndr": "leaf02"}
    assert hostvars["gpuctl_gpu"]["nvlink_per_pair"] == "NV18"
    assert hostvars["nvidia_driver_version"] == "570.133.20"
    assert hostvars["gpuctl_thresholds"]["nccl_all_reduce_busbw_gbs"] == 470
    assert hostvars["gpuctl_thresholds"]["ib_write_bw_gbps"] == 375
    # the known_hosts path is resolved by Ansible relative to the inventory: host keys checked
    out = _ansible(
        tmp_path, "ansible", "gpu001", "-m", "debug", "-a", "var=ansible_ssh_common_args"
    )
    assert f"UserKnownHostsFile={tmp_path}/known_hosts" in out.replace("\n        ", " ")
    assert "StrictHostKeyChecking=yes" in out
    dump = _ansible(tmp_path, "ansible-config", "dump", "--only-changed", "-t", "all")
    assert "HOST_KEY_CHECKING(" in dump
    assert "= True" in dump.split("HOST_KEY_CHECKING(")[1].splitlines()[0]
    assert "pipelining(" in dump
    assert "ControlPersist=300s" in dump


def test_slurm_files_of_the_example() -> None:
    files = render_files(load_cluster(GOLDEN_EXAMPLE))
    conf = files["slurm/slurm.conf"]
    assert "SlurmctldHost=head01(10.0.0.1)\nSlurmctldHost=head02(10.0.0.2)\n" in conf
    assert (
        "NodeName=gpu[001-004] NodeAddr=10.0.1.[1-4] CPUs=224 Sockets=2 CoresPerSocket=56 "
        "ThreadsPerCore=2 RealMemory=2000000 Gres=gpu:h100:8"
    ) in conf
    assert "PartitionName=gpu Nodes=gpu[001-004] Default=YES MaxTime=7-00:00:00 State=UP" in conf
    assert "TopologyPlugin=topology/tree" in conf
    assert "PriorityType=priority/multifactor" in conf
    assert files["slurm/gres.conf"].splitlines()[1:] == [
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-55",
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=56-111",
    ]
    topo = files["slurm/topology.conf"]
    assert "SwitchName=leaf01 Nodes=gpu[001-002]" in topo
    assert "SwitchName=spine Switches=leaf[01-02]" in topo
    assert "ConstrainDevices=yes" in files["slurm/cgroup.conf"]


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(starter("hgx-h100", 4))
    doc.update(changes)
    return doc


def test_node_addresses_that_do_not_fold_in_step_get_one_line_per_node() -> None:
    doc = _doc()
    doc["node_groups"][1]["addresses"] = "10.0.1.9,10.0.1.[2-4]"  # gpu001 -> .9 breaks the order
    files = render_files(load_cluster_text(yaml.safe_dump(doc), "c.yml"))
    conf = files["slurm/slurm.conf"]
    assert "NodeName=gpu001 NodeAddr=10.0.1.9 " in conf
    assert "NodeName=gpu004 NodeAddr=10.0.1.4 " in conf
    assert "NodeAddr=10.0.1.[" not in conf


def test_no_topology_means_no_topology_conf_and_nvml_autodetect() -> None:
    text = starter("workstation")
    doc: dict[str, Any] = yaml.safe_load(text)
    doc["slurm"]["gres_autodetect"] = "nvml"
    files = render_files(load_cluster_text(yaml.safe_dump(doc), "ws.yml"))
    assert "slurm/topology.conf" not in files
    assert "TopologyPlugin" not in files["slurm/slurm.conf"]
    assert files["slurm/gres.conf"].splitlines()[1:] == ["AutoDetect=nvml"]
    assert "Gres=gpu:rtx6000ada:1" in files["slurm/slurm.conf"]


def test_cpu_only_cluster_has_no_gres() -> None:
    doc = _doc(fabrics=[])
    doc["node_groups"][1].pop("gpus")
    doc["node_groups"][1].pop("nics")
    doc["software"].pop("fabric_manager", None)
    files = render_files(load_cluster_text(yaml.safe_dump(doc), "cpu.yml"))
    assert "GresTypes" not in files["slurm/slurm.conf"]
    assert "Gres=" not in files["slurm/slurm.conf"]


@pytest.mark.parametrize(
    "template", sorted(str(p.relative_to(templates_dir())) for p in templates_dir().rglob("*.j2"))
)
def test_every_template_compiles(template: str) -> None:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=False)  # noqa: S701 - config files
    env.get_template(template)  # raises TemplateSyntaxError on a syntax error


def _vars_of(files: dict[str, str], path: str) -> dict[str, Any]:
    data = yaml.safe_load(files[path])
    assert isinstance(data, dict)
    return data


def test_roce_groups_get_the_fabric_qos_and_ib_fabrics_opensm_on_one_host() -> None:
    roce = render_files(load_cluster(ROOT / "inventories" / "a100-roce.yml"))
    groups = [p for p in roce if p.startswith("group_vars/ng_")]
    with_qos = [_vars_of(roce, p) for p in groups if "roce_qos_devices" in _vars_of(roce, p)]
    assert with_qos, groups
    for gv in with_qos:
        assert gv["roce_qos_devices"] == gv["rdma_devices"]
        assert (gv["roce_qos_trust"], gv["roce_qos_pfc_priority"]) in {("dscp", 3), ("pcp", 3)}
        assert isinstance(gv["roce_qos_ecn"], bool)
    assert "rdma_opensm_enabled" not in roce["inventory.yml"]

    doc = _doc()
    doc["fabrics"][0]["subnet_manager"] = "opensm"
    doc["fabrics"][0]["ipoib"] = {"network": "10.10.0.0/16"}
    files = render_files(load_cluster_text(yaml.safe_dump(doc), "c.yml"))
    hosts = yaml.safe_load(files["inventory.yml"])["all"]["children"]["ng_hgx"]["hosts"]
    with_sm = [h for h, hv in hosts.items() if hv.get("rdma_opensm_enabled")]
    assert with_sm == ["gpu001"]
    assert [hv["rdma_ipoib"] for hv in hosts.values()][:2] == [
        [{"device": "mlx5_0", "address": "10.10.0.1/16"}],
        [{"device": "mlx5_0", "address": "10.10.0.2/16"}],
    ]


def test_perftest_with_cuda_is_for_gpu_hosts_with_rdma_nics_only() -> None:
    doc = _doc()
    doc["software"]["perftest"] = "25.10.0-0.128"
    doc["package_sources"]["perftest"] = "http://git.example.com/mirror/perftest.git"
    files = render_files(load_cluster_text(yaml.safe_dump(doc), "c.yml"))
    gpu_nic = _vars_of(files, "group_vars/ng_hgx.yml")
    assert gpu_nic["rdma_devices"]  # the group has GPUs and RDMA NICs
    assert {k: v for k, v in gpu_nic.items() if k.startswith("validation_tools_")} == {
        "validation_tools_perftest_version": "25.10.0-0.128",
        "validation_tools_perftest_repo_url": "http://git.example.com/mirror/perftest.git",
        "validation_tools_perftest_cuda_version": "12.8",
        # the nccl role's CUDA home for nccl-tests (/usr/local/cuda-<nccl's +cudaX.Y>)
        "validation_tools_perftest_cuda_home": "/usr/local/cuda-12.8",
    }
    cpu_only = _vars_of(files, "group_vars/ng_head.yml")
    assert cpu_only["gpuctl_gpu"] is None
    assert not any(k.startswith("validation_tools_") for k in cpu_only)
    assert "validation_tools_" not in files["group_vars/all.yml"]

    # null: the GPU hosts with NICs get an empty version, which the role builds nothing for
    del doc["software"]["perftest"]
    files = render_files(load_cluster_text(yaml.safe_dump(doc), "c.yml"))
    assert _vars_of(files, "group_vars/ng_hgx.yml")["validation_tools_perftest_version"] == ""
    # GPUs without RDMA NICs: nothing
    doc["node_groups"][1].pop("nics")
    doc["fabrics"] = []
    doc["software"]["perftest"] = "25.10.0-0.128"
    files = render_files(load_cluster_text(yaml.safe_dump(doc), "c.yml"))
    assert not any(
        k.startswith("validation_tools_") for k in _vars_of(files, "group_vars/ng_hgx.yml")
    )


def test_ipoib_network_too_small_is_an_error_not_a_clash() -> None:
    doc = _doc()
    doc["fabrics"][0]["ipoib"] = {"network": "10.10.0.0/30"}  # 2 usable addresses, 4 hosts
    with pytest.raises(RenderError, match=r"IPoIB network 10\.10\.0\.0/30 has no room for 4"):
        render_files(load_cluster_text(yaml.safe_dump(doc), "c.yml"))


def test_relative_ssh_paths_are_relative_to_cluster_yml(tmp_path: Path) -> None:
    text = (ROOT / "inventories" / "lab.yml").read_text()
    (tmp_path / "site").mkdir()
    path = tmp_path / "site" / "cluster.yml"
    path.write_text(text)  # private_key: .gpuctl/lab/id_ed25519, known_hosts: .gpuctl/lab/...
    cluster = load_cluster(path)
    assert cluster.ssh.private_key == str(tmp_path / "site" / ".gpuctl/lab/id_ed25519")
    assert cluster.ssh.known_hosts == str(tmp_path / "site" / ".gpuctl/lab/known_hosts")
    inventory = render_files(cluster)["inventory.yml"]
    assert f"ansible_ssh_private_key_file: {tmp_path}/site/.gpuctl/lab/id_ed25519" in inventory
    home = load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml")
    assert home.ssh.private_key == "~/.ssh/id_ed25519"  # ssh expands ~ itself
