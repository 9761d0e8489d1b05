"""Every example cluster.yml in inventories/ and every `gpuctl init` profile loads and renders."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.config.derived import summarize
from gpuctl.render import render_files
from gpuctl.starter import PROFILES, starter

EXAMPLES = sorted((ROOT / "inventories").glob("*.yml"))


def test_the_examples_the_issue_asks_for_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"lab", "hgx-h100-ndr", "a100-roce", "l40s-pcie", "workstation"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_loads_and_renders(path: Path) -> None:
    cluster = load_cluster(path)
    files = render_files(cluster)
    assert "inventory.yml" in files
    assert "slurm/slurm.conf" in files
    assert all(text.endswith("\n") for text in files.values())
    inventory = yaml.safe_load(files["inventory.yml"])
    hosts = [
        h
        for name, group in inventory["all"]["children"].items()
        if name.startswith("ng_")
        for h in group["hosts"]
    ]
    assert len(hosts) == len(set(hosts)) == summarize(cluster).node_count


def test_example_shapes() -> None:
    by_name = {p.stem: summarize(load_cluster(p)) for p in EXAMPLES}
    lab = by_name["lab"]
    assert lab.node_count == 3
    assert lab.nodes_by_role == {"compute": 2, "controller": 1}
    hgx = by_name["hgx-h100-ndr"]
    assert hgx.nodes_by_role["compute"] == 4
    assert hgx.gpus_by_model == {"h100-sxm": 32}
    assert hgx.fabric_manager is True
    assert [(f.kind, f.generation, f.leaves, f.spines) for f in hgx.fabrics] == [
        ("infiniband", "ndr", 2, 1)
    ]
    roce = by_name["a100-roce"]
    assert roce.fabrics[0].kind == "roce"
    assert roce.fabrics[0].rate_gbps == 200
    l40s = by_name["l40s-pcie"]
    assert l40s.fabric_manager is False
    assert l40s.groups[1].interconnect == "pcie-switch"
    ws = by_name["workstation"]
    assert ws.node_count == 1
    assert ws.gpu_count == 1
    assert ws.fabrics == ()


def test_lab_example_stays_in_the_lab_range() -> None:
    import ipaddress

    lab_net = ipaddress.ip_network("198.18.0.0/15")
    cluster = load_cluster(ROOT / "inventories" / "lab.yml")
    for group in cluster.node_groups:
        for addr in group.address_list() or []:
            assert ipaddress.ip_address(addr) in lab_net


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_init_profile_is_valid(profile: str) -> None:
    text = starter(profile)
    assert text.startswith("# yaml-language-server: $schema=")
    cluster = load_cluster_text(text, profile)
    assert cluster.name
    render_files(cluster)


@pytest.mark.parametrize(
    ("profile", "nodes"),
    [
        ("hgx-h100", 1),
        ("hgx-h100", 3),
        ("hgx-h100", 100),
        ("a100-roce", 65),
        ("l40s-pcie", 12),
        ("lab", 5),
    ],
)
def test_init_scales_with_nodes(profile: str, nodes: int) -> None:
    summary = summarize(load_cluster_text(starter(profile, nodes), profile))
    assert summary.nodes_by_role["compute"] == nodes
