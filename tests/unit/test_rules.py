"""Cross-field rules of cluster.yml: one operator mistake per case, located by path and line.

Every case starts from the valid hgx-h100 starter (``valid_doc``): head01 (controller, login) and
gpu[001-004] (8 x h100-sxm on NVSwitch, mlx5_[0-7] on the NDR fabric ``ib``), one partition
``gpu``. The fixture ``doc`` pins the fat tree of ``ib`` to leaf01/leaf02 under spine01/spine02
under core (the starter's own tree may change) and checks the rest of that shape.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from gpuctl.config.findings import RuleViolations, loc_to_str
from gpuctl.config.loader import load_cluster_text
from gpuctl.config.model import Cluster
from gpuctl.errors import ConfigError, Problem
from gpuctl.starter import PROFILES, starter

Doc = dict[str, Any]
Mistake = Callable[[Doc], None]

CASES: list[Any] = []


def case(path: str, fragment: str) -> Callable[[Mistake], Mistake]:
    """Register a mistake and the problem it must cause: exact path, part of the message."""

    def register(fn: Mistake) -> Mistake:
        CASES.append(pytest.param(fn, path, fragment, id=fn.__name__))
        return fn

    return register


def _dump(doc: Doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def _problems(text: str) -> list[Problem]:
    try:
        load_cluster_text(text, "c.yml")
    except ConfigError as exc:
        return list(exc.problems)
    return []


def _parts(path: str) -> list[str | int]:
    """``node_groups[1].gpus`` -> ``["node_groups", 1, "gpus"]``."""
    parts: list[str | int] = []
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        parts.append(int(index) if index else name)
    assert loc_to_str(parts) == path
    return parts


def _existing_prefix(doc: Doc, parts: list[str | int]) -> list[str | int]:
    node: Any = doc
    kept: list[str | int] = []
    for part in parts:
        in_list = isinstance(part, int) and isinstance(node, list) and part < len(node)
        in_mapping = isinstance(part, str) and isinstance(node, dict) and part in node
        if not (in_list or in_mapping):
            break
        node = node[part]
        kept.append(part)
    return kept


def _assert_points_at(text: str, doc: Doc, problem: Problem) -> None:
    """The problem's line and column are those of its path (or of the nearest parent present)."""
    assert problem.file == "c.yml"
    assert problem.line is not None
    assert problem.column is not None
    lines = text.splitlines()
    line = lines[problem.line - 1]
    before = line[: problem.column - 1]
    prefix = _existing_prefix(doc, _parts(problem.path))
    if not prefix:
        assert (problem.line, problem.column) == (1, 1), problem
        return
    last = prefix[-1]
    if isinstance(last, int):
        assert before.rstrip().endswith("-"), (problem, line)
    elif before.rstrip().endswith(f"{last}:"):
        pass  # a scalar (or flow) value on the key's line
    else:  # a block mapping or sequence starts on the line below its key
        assert lines[problem.line - 2].rstrip().endswith(f"{last}:"), (problem, line)


def _group(doc: Doc, name: str) -> Doc:
    found: Doc = next(g for g in doc["node_groups"] if g["name"] == name)
    return found


def _fabric(doc: Doc) -> Doc:
    found: Doc = doc["fabrics"][0]
    return found


def _to_roce(doc: Doc, rate: int | None = 400) -> Doc:
    fab = _fabric(doc)
    fab["kind"] = "roce"
    del fab["generation"], fab["subnet_manager"]
    if rate is not None:
        fab["rate_gbps"] = rate
    return fab


def _pcie_gpus(doc: Doc) -> None:
    """Turn the HGX group into 8 x L40S on a PCIe switch (no NVSwitch anywhere)."""
    _group(doc, "hgx")["gpus"] = {"model": "l40s", "count": 8, "interconnect": "pcie-switch"}


TREE: Doc = {
    "leaves": [
        {"name": "leaf01", "nodes": "gpu[001-002]"},
        {"name": "leaf02", "nodes": "gpu[003-004]"},
    ],
    "spines": [
        {"name": "spine01", "switches": "leaf[01-02]"},
        {"name": "spine02", "switches": "leaf[01-02]"},
        {"name": "core", "switches": "spine[01-02]"},
    ],
}


@pytest.fixture
def doc(valid_doc: Doc) -> Doc:
    """The valid document with the fat tree above; fails loudly if the starter's shape drifts."""
    assert [g["name"] for g in valid_doc["node_groups"]] == ["head", "hgx"]
    assert valid_doc["node_groups"][0]["nodes"] == "head01"
    hgx = valid_doc["node_groups"][1]
    assert hgx["nodes"] == "gpu[001-004]"
    assert hgx["gpus"] == {
        "model": "h100-sxm",
        "count": 8,
        "interconnect": "nvswitch",
        "cpu_affinity": [0, 0, 0, 0, 1, 1, 1, 1],
    }
    assert hgx["nics"] == [{"devices": "mlx5_[0-7]", "fabric": "ib", "rails": True}]
    assert [f["name"] for f in valid_doc["fabrics"]] == ["ib"]
    assert valid_doc["software"]["driver"]["version"] == "570.133.20"
    assert valid_doc["software"]["cuda"] == "12.8"
    assert valid_doc["slurm"]["partitions"] == [
        {"name": "gpu", "node_groups": ["hgx"], "default": True}
    ]
    assert valid_doc["rollout"]["max_unavailable"] == "10%"
    valid_doc["fabrics"][0]["topology"] = copy.deepcopy(TREE)
    return valid_doc


# --------------------------------------------------------------------------------------------
# node names and addresses


@case("node_groups[2].name", "node group name 'hgx' is already used at node_groups[1].name")
def duplicate_group_name(doc: Doc) -> None:
    doc["node_groups"].append({"name": "hgx", "nodes": "gpu[005-006]", "roles": ["compute"]})


@case("node_groups[2].nodes", "gpu004 already in node_groups[1] (hgx); node names must be unique")
def node_in_two_groups(doc: Doc) -> None:
    doc["node_groups"].append({"name": "more", "nodes": "gpu[004-005]", "roles": ["compute"]})


@case("node_groups[0].nodes", "'head_01' is not a valid host name")
def invalid_host_name(doc: Doc) -> None:
    _group(doc, "head")["nodes"] = "head_01"
    doc["slurm"]["controller"] = "head_01"


@case("node_groups[0].nodes", "'-head' is not a valid host name")
def host_name_starting_with_a_dash(doc: Doc) -> None:
    _group(doc, "head")["nodes"] = "-head"
    doc["slurm"]["controller"] = "-head"


@case("node_groups[1].addresses", "3 addresses for 4 nodes; give one per node")
def too_few_addresses(doc: Doc) -> None:
    _group(doc, "hgx")["addresses"] = "10.0.0.[11-13]"


@case("node_groups[1].addresses", "'10.0.0.256' is not an IP address")
def address_not_an_ip(doc: Doc) -> None:
    _group(doc, "hgx")["addresses"] = "10.0.0.[253-256]"


@case("node_groups[1].addresses", "address '10.0.0.11' is already used at node_groups[0].addresses")
def duplicate_address(doc: Doc) -> None:
    _group(doc, "head")["addresses"] = "10.0.0.11"
    _group(doc, "hgx")["addresses"] = "10.0.0.[11-14]"


@case("node_groups[1].nodes", "expands to 200000 names; gpuctl handles at most 100000")
def node_set_typo_expands_to_too_many_names(doc: Doc) -> None:
    _group(doc, "hgx")["nodes"] = "gpu[1-100]-[1-100]-[1-20]"


# --------------------------------------------------------------------------------------------
# GPUs


@case("node_groups[1].gpus.count", "l40s servers hold at most 10 GPUs, not 12")
def gpu_count_over_model_max(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"] = {"model": "l40s", "count": 12, "interconnect": "pcie-switch"}


@case("node_groups[1].gpus.interconnect", "h100-sxm GPUs do not connect by pcie; expected one of")
def interconnect_not_allowed_for_model(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"]["interconnect"] = "pcie"


@case("node_groups[1].gpus", "b200 GPUs do not connect by none")
def implied_interconnect_not_allowed_points_at_gpus(doc: Doc) -> None:
    # no interconnect given: the problem is the gpus mapping, not a key that is not there
    _group(doc, "hgx")["gpus"] = {"model": "b200", "count": 1}


@case("node_groups[1].gpus.count", "an NVSwitch baseboard of h100-sxm has 8 GPUs, not 4")
def nvswitch_board_of_four(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"]["count"] = 4


@case("node_groups[1].gpus.interconnect", "interconnect none means one GPU, but count is 2")
def interconnect_none_with_two_gpus(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"] = {"model": "l40s", "count": 2, "interconnect": "none"}


@case("node_groups[1].gpus.interconnect", "a single GPU has no nvswitch interconnect; use none")
def single_gpu_on_nvswitch(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"]["count"] = 1


@case("node_groups[1].gpus.interconnect", "NVLink bridges join GPUs in pairs; count 3 is odd")
def odd_nvlink_bridge_count(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"] = {"model": "h100-nvl", "count": 3, "interconnect": "nvlink-bridge"}


# --------------------------------------------------------------------------------------------
# software


@case("software.driver.branch", 'driver branch is three digits like "570", not "r570"')
def driver_branch_format(doc: Doc) -> None:
    doc["software"]["driver"]["branch"] = "r570"


@case("software.driver.version", '"570.133.20-1" is not a driver version like "570.133.20"')
def driver_version_format(doc: Doc) -> None:
    doc["software"]["driver"]["version"] = "570.133.20-1"


@case("software.driver.version", "driver 565.57.01 is not on branch 570")
def driver_version_not_on_branch(doc: Doc) -> None:
    doc["software"]["driver"]["version"] = "565.57.01"


@case("software.driver.kernel_modules", "b200 GPUs (node_groups[1]) need open kernel modules")
def b200_with_proprietary_modules(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"]["model"] = "b200"
    doc["software"]["driver"]["kernel_modules"] = "proprietary"


@case("software.driver.version", "b200 GPUs (node_groups[1]) need driver 570.133.20 or later")
def b200_on_a_driver_older_than_its_published_minimum(doc: Doc) -> None:
    _group(doc, "hgx")["gpus"]["model"] = "b200"
    doc["software"]["driver"]["version"] = "570.124.06"


@case("software.fabric_manager.enabled", "NVSwitch GPUs need Fabric Manager")
def fabric_manager_disabled_on_nvswitch(doc: Doc) -> None:
    doc["software"]["fabric_manager"] = {"enabled": False}


@case("software.fabric_manager.version", "Fabric Manager 570.124.06 must equal the driver version")
def fabric_manager_version_differs_from_driver(doc: Doc) -> None:
    doc["software"]["fabric_manager"] = {"version": "570.124.06"}


@case("software.fabric_manager.enabled", "Fabric Manager is only for NVSwitch systems")
def fabric_manager_enabled_without_nvswitch(doc: Doc) -> None:
    _pcie_gpus(doc)
    doc["software"]["fabric_manager"] = {"enabled": True}


@case("software.fabric_manager.version", "Fabric Manager is only for NVSwitch systems")
def fabric_manager_version_without_nvswitch(doc: Doc) -> None:
    _pcie_gpus(doc)
    doc["software"]["fabric_manager"] = {"version": "570.133.20"}


@case("software.nccl", "NCCL 2.26.2-1+cuda12.9 is built for CUDA 12.9, but software.cuda is 12.8")
def nccl_built_for_another_cuda(doc: Doc) -> None:
    doc["software"]["nccl"] = "2.26.2-1+cuda12.9"


@case("software.nccl", '"2.26.2" is not an NCCL package version like "2.26.2-1+cuda12.8"')
def nccl_version_without_package_suffix(doc: Doc) -> None:
    doc["software"]["nccl"] = "2.26.2"


@case("software.rdma.doca_version", "doca-ofed needs doca_version")
def doca_ofed_without_version(doc: Doc) -> None:
    doc["software"]["rdma"] = {"stack": "doca-ofed"}


@case("software.rdma.doca_version", "doca_version is only used with doca-ofed")
def doca_version_with_inbox(doc: Doc) -> None:
    doc["software"]["rdma"] = {"stack": "inbox", "doca_version": "2.9.1"}


@case("software.mpi", "hpcx needs version and url")
def hpcx_without_url(doc: Doc) -> None:
    doc["software"]["mpi"] = {"flavor": "hpcx", "version": "2.22.1"}


@case("software.mpi", "hpcx needs version and url")
def hpcx_without_version(doc: Doc) -> None:
    doc["software"]["mpi"] = {"flavor": "hpcx", "url": "https://example.com/hpcx.tbz"}


@case("software.cuda", "write versions as quoted strings")
def cuda_version_as_yaml_number(doc: Doc) -> None:
    doc["software"]["cuda"] = 12.8


@case("software.driver.branch", 'write versions as quoted strings ("570")')
def driver_branch_as_yaml_number(doc: Doc) -> None:
    doc["software"]["driver"]["branch"] = 570


@case("software", 'cuda must be major.minor like "12.8", not "12.8.1"')
def cuda_with_patch_version(doc: Doc) -> None:
    doc["software"]["cuda"] = "12.8.1"


# --------------------------------------------------------------------------------------------
# fabrics and NICs


@case("fabrics[1].name", "fabric name 'ib' is already used at fabrics[0].name")
def duplicate_fabric_name(doc: Doc) -> None:
    doc["fabrics"].append({"name": "ib", "kind": "infiniband", "generation": "hdr"})


@case("fabrics[0].generation", "InfiniBand fabrics need a generation (fdr, edr, hdr, ndr or xdr)")
def infiniband_without_generation(doc: Doc) -> None:
    del _fabric(doc)["generation"]


@case("fabrics[0].rate_gbps", "HDR runs at 200 or 100 Gb/s, not 400")
def hdr_at_400(doc: Doc) -> None:
    _fabric(doc).update(generation="hdr", rate_gbps=400)


@case("fabrics[0].rate_gbps", "RoCE fabrics need rate_gbps (100, 200 or 400)")
def roce_without_rate(doc: Doc) -> None:
    _to_roce(doc, rate=None)


@case("fabrics[0].rate_gbps", "RoCE runs at 100 or 200 or 400 Gb/s, not 800")
def roce_at_800(doc: Doc) -> None:
    _to_roce(doc, rate=800)


@case("fabrics[0].generation", "generation is for InfiniBand; RoCE fabrics give rate_gbps")
def roce_with_generation(doc: Doc) -> None:
    _to_roce(doc)["generation"] = "ndr"


@case("fabrics[0].qos", "qos (PFC/ECN/DSCP) applies to RoCE fabrics only")
def qos_on_infiniband(doc: Doc) -> None:
    _fabric(doc)["qos"] = {"trust": "dscp"}


@case("fabrics[0].subnet_manager", "subnet_manager applies to InfiniBand fabrics only")
def subnet_manager_on_roce(doc: Doc) -> None:
    _to_roce(doc)["subnet_manager"] = "opensm"


@case("fabrics[0].ipoib", "ipoib applies to InfiniBand fabrics only")
def ipoib_on_roce(doc: Doc) -> None:
    _to_roce(doc)["ipoib"] = {"network": "10.10.0.0/16"}


@case("node_groups[1].nics[0].fabric", "no fabric named 'eth' in fabrics; defined: ib")
def nic_on_unknown_fabric(doc: Doc) -> None:
    _group(doc, "hgx")["nics"][0]["fabric"] = "eth"


@case("node_groups[1].nics[0].fabric", "no fabric named 'ib' in fabrics; none is defined")
def nic_when_no_fabric_is_defined(doc: Doc) -> None:
    doc["fabrics"] = []


@case("node_groups[1].nics[0].rate_gbps", "fabric ib (infiniband) runs at 400 or 200 Gb/s, not 100")
def nic_rate_not_allowed_on_fabric(doc: Doc) -> None:
    _group(doc, "hgx")["nics"][0]["rate_gbps"] = 100


@case(
    "node_groups[1].nics[1].devices",
    "device 'mlx5_7' is already used at node_groups[1].nics[0].devices",
)
def duplicate_device_in_group(doc: Doc) -> None:
    _group(doc, "hgx")["nics"].append({"devices": "mlx5_[7-8]", "fabric": "ib"})


# --------------------------------------------------------------------------------------------
# topology


@case("fabrics[0].topology.leaves[1].nodes", "gpu005 not defined in any node group")
def leaf_names_unknown_node(doc: Doc) -> None:
    _fabric(doc)["topology"]["leaves"][1]["nodes"] = "gpu[003-005]"


@case(
    "fabrics[0].topology.leaves[1].nodes",
    "gpu002 already hangs off leaf01; a node connects to one leaf",
)
def node_on_two_leaves(doc: Doc) -> None:
    _fabric(doc)["topology"]["leaves"][1]["nodes"] = "gpu[002-004]"


@case("fabrics[0].topology.leaves", "gpu004 have adapters on ib but hang off no leaf")
def node_with_adapter_on_no_leaf(doc: Doc) -> None:
    _fabric(doc)["topology"]["leaves"][1]["nodes"] = "gpu003"


@case(
    "fabrics[0].topology.leaves[0].nodes",
    "head01 hang off leaf01 but have no adapter on ib",
)
def leaf_node_without_adapter(doc: Doc) -> None:
    _fabric(doc)["topology"]["leaves"][0]["nodes"] = "head01,gpu[001-002]"


@case("fabrics[0].topology.spines[0].switches", "leaf03 not defined as leaves or spines of ib")
def spine_names_unknown_switch(doc: Doc) -> None:
    _fabric(doc)["topology"]["spines"][0]["switches"] = "leaf[01-03]"


@case("fabrics[0].topology.spines[0].switches", "spine01 lists itself")
def spine_lists_itself(doc: Doc) -> None:
    _fabric(doc)["topology"]["spines"][0]["switches"] = "leaf[01-02],spine01"


@case("fabrics[0].topology.spines", "the switch tree has a cycle")
def cycle_in_spines(doc: Doc) -> None:
    _fabric(doc)["topology"]["spines"][0]["switches"] = "leaf[01-02],core"


@case("fabrics[0].topology.leaves", "switches leaf01, leaf02 have no common spine")
def two_leaves_and_no_spine(doc: Doc) -> None:
    _fabric(doc)["topology"]["spines"] = []


@case("fabrics[0].topology.spines", "switches spine01, spine02 have no common spine")
def two_spines_without_a_core(doc: Doc) -> None:
    spines = _fabric(doc)["topology"]["spines"]
    spines[:] = [
        {"name": "spine01", "switches": "leaf01"},
        {"name": "spine02", "switches": "leaf02"},
    ]


@case(
    "fabrics[0].topology.spines[1].name",
    "switch name 'leaf02' is already used at fabrics[0].topology.leaves[1].name",
)
def duplicate_switch_name(doc: Doc) -> None:
    _fabric(doc)["topology"]["spines"][1]["name"] = "leaf02"


# --------------------------------------------------------------------------------------------
# Slurm


@case("slurm.controller", "'head02' is not a node of the cluster")
def controller_not_a_node(doc: Doc) -> None:
    doc["slurm"]["controller"] = "head02"


@case("slurm.controller", "gpu001 is in a node group without the controller role")
def controller_without_controller_role(doc: Doc) -> None:
    doc["slurm"]["controller"] = "gpu001"


@case("slurm.backup_controller", "'head02' is not a node of the cluster")
def backup_controller_not_a_node(doc: Doc) -> None:
    doc["slurm"]["backup_controller"] = "head02"


@case("slurm.backup_controller", "the backup controller is the controller")
def backup_controller_is_the_controller(doc: Doc) -> None:
    doc["slurm"]["backup_controller"] = "head01"


@case("node_groups", "no node group has the controller role")
def no_controller_role(doc: Doc) -> None:
    _group(doc, "head")["roles"] = ["login"]


@case("node_groups", "no node group has the compute role")
def no_compute_role(doc: Doc) -> None:
    _group(doc, "hgx")["roles"] = ["login"]


@case(
    "slurm.partitions[1].name", "partition name 'gpu' is already used at slurm.partitions[0].name"
)
def duplicate_partition_name(doc: Doc) -> None:
    doc["slurm"]["partitions"].append({"name": "gpu", "nodes": "gpu001"})


@case("slurm.partitions[1].default", "partitions[0] is already the default partition")
def two_default_partitions(doc: Doc) -> None:
    doc["slurm"]["partitions"].append({"name": "debug", "nodes": "gpu001", "default": True})


@case("slurm.partitions[0].node_groups[1]", "no node group named 'dgx'; defined: head, hgx")
def partition_with_unknown_group(doc: Doc) -> None:
    doc["slurm"]["partitions"][0]["node_groups"] = ["hgx", "dgx"]


@case("slurm.partitions[0].nodes", "gpu005 not defined in any node group")
def partition_with_unknown_nodes(doc: Doc) -> None:
    doc["slurm"]["partitions"][0]["nodes"] = "gpu[004-005]"


@case("slurm.partitions[0]", "head01 run no slurmd (no compute role)")
def partition_of_non_compute_nodes(doc: Doc) -> None:
    doc["slurm"]["partitions"][0]["node_groups"] = ["hgx", "head"]


@case("slurm.partitions[0]", "a partition needs node_groups or nodes")
def partition_without_nodes(doc: Doc) -> None:
    del doc["slurm"]["partitions"][0]["node_groups"]


@case("slurm.topology_fabric", "no fabric named 'eth'; defined: ib")
def topology_fabric_unknown(doc: Doc) -> None:
    doc["slurm"]["topology_fabric"] = "eth"


@case("slurm.topology_fabric", "fabric eth has no topology")
def topology_fabric_without_topology(doc: Doc) -> None:
    doc["fabrics"].append({"name": "eth", "kind": "roce", "rate_gbps": 200})
    doc["slurm"]["topology_fabric"] = "eth"


@case("slurm.topology_fabric", "several fabrics have a topology; name the one for topology.conf")
def topology_fabric_needed_with_two_trees(doc: Doc) -> None:
    doc["fabrics"].append(
        {
            "name": "ib2",
            "kind": "infiniband",
            "generation": "ndr",
            "topology": {"leaves": [{"name": "leaf09", "nodes": "gpu[001-004]"}]},
        }
    )
    _group(doc, "hgx")["nics"].append({"devices": "mlx5_[8-9]", "fabric": "ib2"})


@case("slurm.extra.SlurmUser", "SlurmUser is written by gpuctl from other fields")
def slurm_extra_overrides_managed_key(doc: Doc) -> None:
    doc["slurm"]["extra"] = {"SlurmUser": "slurm", "MaxJobCount": 20000}


@case("slurm.extra.partitionname", "partitionname is written by gpuctl")
def slurm_extra_managed_key_in_other_case(doc: Doc) -> None:
    doc["slurm"]["extra"] = {"partitionname": "x"}


# --------------------------------------------------------------------------------------------
# SSH, rollout, Ansible names


@case("ssh.become", "provisioning needs root: user ops must become root (sudo)")
def non_root_user_without_become(doc: Doc) -> None:
    doc["ssh"].update(user="ops", become=False)


@case("rollout.max_unavailable", "give batch_size or max_unavailable, not both")
def rollout_batch_size_and_max_unavailable(doc: Doc) -> None:
    doc["rollout"]["batch_size"] = 2


@case("rollout.canary", "canary of 5 nodes, but the cluster has 4 compute nodes")
def canary_larger_than_cluster(doc: Doc) -> None:
    doc["rollout"]["canary"] = 5


@case("rollout.max_unavailable", "max_unavailable must be at least 1")
def max_unavailable_zero(doc: Doc) -> None:
    doc["rollout"]["max_unavailable"] = 0


@case("node_groups[3].name", "'gpu_a' and 'gpu-a' would be the same Ansible group (gpu_a)")
def ansible_group_name_collision(doc: Doc) -> None:
    doc["node_groups"] += [
        {"name": "gpu-a", "nodes": "cpu01", "roles": ["login"]},
        {"name": "gpu_a", "nodes": "cpu02", "roles": ["login"]},
    ]


@case("fabrics[2].name", "'i_b' and 'i-b' would be the same Ansible group (i_b)")
def ansible_fabric_name_collision(doc: Doc) -> None:
    doc["fabrics"] += [
        {"name": "i-b", "kind": "roce", "rate_gbps": 100},
        {"name": "i_b", "kind": "roce", "rate_gbps": 100},
    ]


@case(
    "fabrics[0].topology.leaves[1].name",
    "'leaf_01' and 'leaf-01' would be the same Ansible group",
)
def ansible_leaf_name_collision(doc: Doc) -> None:
    leaves = _fabric(doc)["topology"]["leaves"]
    leaves[0]["name"], leaves[1]["name"] = "leaf-01", "leaf_01"
    _fabric(doc)["topology"]["spines"] = [
        {"name": "spine01", "switches": "leaf-01,leaf_01"},
    ]


# --------------------------------------------------------------------------------------------
# tests


def test_the_valid_document_has_no_problem(valid_doc: Doc) -> None:
    assert _problems(_dump(valid_doc)) == []


def test_the_pinned_fat_tree_has_no_problem(doc: Doc) -> None:
    assert doc["fabrics"][0]["topology"] == TREE
    assert _problems(_dump(doc)) == []


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_starter_profile_passes_the_rules(profile: str) -> None:
    assert _problems(starter(profile)) == []


@pytest.mark.parametrize(("mistake", "path", "fragment"), CASES)
def test_rule(doc: Doc, mistake: Mistake, path: str, fragment: str) -> None:
    mistake(doc)
    text = _dump(doc)
    problems = _problems(text)
    matching = [p for p in problems if p.path == path and fragment in p.message]
    assert matching, f"expected {path}: ...{fragment}...; got:\n" + "\n".join(map(str, problems))
    for problem in matching:
        _assert_points_at(text, doc, problem)


def test_every_case_has_a_distinct_mistake() -> None:
    names = [p.id for p in CASES]
    assert len(names) == len(set(names))
    assert len(CASES) >= 70


def test_all_rules_run_in_one_pass(doc: Doc) -> None:
    """Two unrelated mistakes are both reported, sorted by line."""
    doc["software"]["nccl"] = "2.26.2-1+cuda12.9"
    doc["rollout"]["canary"] = 9
    problems = _problems(_dump(doc))
    assert [p.path for p in problems] == ["software.nccl", "rollout.canary"]
    lines = [p.line or 0 for p in problems]
    assert lines == sorted(lines)


def test_rule_violations_keep_paths_as_tuples(valid_doc: Doc) -> None:
    """Validating a dict (no YAML) raises RuleViolations with the structured locations."""
    valid_doc["slurm"]["controller"] = "gpu001"
    with pytest.raises(RuleViolations) as info:
        Cluster.model_validate(valid_doc)
    assert info.value.findings[0][0] == ("slurm", "controller")
    assert [p.path for p in info.value.problems] == ["slurm.controller"]
    assert info.value.problems[0].line is None  # positions come from the loader only


def test_problem_points_at_the_offending_line(doc: Doc) -> None:
    """Exact line and column of one rule problem, counted from the text."""
    doc["rollout"]["canary"] = 5
    text = _dump(doc)
    (problem,) = _problems(text)
    lines = text.splitlines()
    expected_line = next(i for i, line in enumerate(lines, 1) if line.startswith("  canary:"))
    assert (problem.line, problem.column) == (expected_line, len("  canary: ") + 1)
    assert str(problem) == (
        f"c.yml:{expected_line}:11: rollout.canary: "
        "canary of 5 nodes, but the cluster has 4 compute nodes"
    )


def test_dashes_and_underscores_in_one_name_are_no_collision(doc: Doc) -> None:
    doc["node_groups"].append({"name": "gpu-a_b", "nodes": "cpu01", "roles": ["login"]})
    assert _problems(_dump(doc)) == []


def test_a_key_that_is_not_a_string_is_named_not_a_crash() -> None:
    """Found by the loader fuzz test: `~: ~<TAB>,` has a null key whose value holds a control
    character; naming its place raised TypeError (an internal error, exit 70) instead of one
    problem line."""
    assert loc_to_str([None, "x", 2]) == "null.x[2]"  # type: ignore[list-item]
    assert loc_to_str(["a", True]) == "a.true"
    [problem] = _problems("~: ~\t,\n")
    assert problem.path == "null"
    assert "control character U+0009" in problem.message
