"""Effective thresholds (which value wins, and where it came from) and the `check` summary."""

from __future__ import annotations

from typing import Any

import yaml
from helpers import ROOT

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.config.derived import effective_thresholds, nodes, summarize
from gpuctl.starter import starter


def _cluster(doc: dict[str, Any]) -> Any:
    return load_cluster_text(yaml.safe_dump(doc), "c.yml")


def test_threshold_precedence_group_over_cluster_over_model_over_defaults() -> None:
    doc: dict[str, Any] = yaml.safe_load(starter("hgx-h100", 2))
    base = _cluster(doc)
    th = effective_thresholds(base, base.node_groups[1], 1)
    assert th["nccl_all_reduce_busbw_gbs"].value == 460
    assert "h100-sxm" in th["nccl_all_reduce_busbw_gbs"].source
    assert th["ib_write_bw_gbps"].value == 375
    assert "(NDR) at 400" in th["ib_write_bw_gbps"].source
    assert th["sram_correctable_max"].value == 10000
    assert th["nccl_multinode_busbw_gbs"].value is None

    doc["validation"]["thresholds"] = {"nccl_all_reduce_busbw_gbs": 450, "ib_write_bw_gbps": 370}
    doc["node_groups"][1]["validation"] = {"thresholds": {"nccl_all_reduce_busbw_gbs": 470}}
    c = _cluster(doc)
    th = effective_thresholds(c, c.node_groups[1], 1)
    assert th["nccl_all_reduce_busbw_gbs"].value == 470
    assert th["nccl_all_reduce_busbw_gbs"].source == "node_groups[1].validation.thresholds"
    assert th["ib_write_bw_gbps"].value == 370
    assert th["ib_write_bw_gbps"].source == "validation.thresholds"


def test_roce_and_edr_floors_are_marked_derived() -> None:
    roce = load_cluster(ROOT / "inventories" / "a100-roce.yml")
    th = effective_thresholds(roce, roce.node_groups[2], 2)
    assert th["ib_write_bw_gbps"].value == 180
    assert "derived" in th["ib_write_bw_gbps"].source


def test_summary_json_has_stable_keys() -> None:
    summary = summarize(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))
    data = summary.to_json()
    assert list(data) == [
        "name",
        "node_count",
        "nodes_by_role",
        "gpu_count",
        "gpus_by_model",
        "controller",
        "partitions",
        "fabric_manager",
        "versions",
        "groups",
        "fabrics",
        "warnings",
    ]
    assert data["node_count"] == 7
    assert data["gpu_count"] == 32
    assert data["versions"]["fabric_manager"] == "570.133.20"
    hgx = data["groups"][2]
    assert hgx["thresholds"]["nccl_all_reduce_busbw_gbs"] == {
        "value": 470,
        "source": "node_groups[2].validation.thresholds",
        "checked_by": ["nccl.busbw"],
    }
    assert data["fabrics"][0] == {
        "name": "ndr",
        "kind": "infiniband",
        "generation": "ndr",
        "rate_gbps": 400,
        "leaves": 2,
        "spines": 1,
        "nodes": 4,
    }


def test_missing_bus_bandwidth_threshold_is_a_warning_not_silence() -> None:
    doc: dict[str, Any] = yaml.safe_load(starter("l40s-pcie"))
    del doc["node_groups"][1]["validation"]
    summary = summarize(_cluster(doc))
    assert any("nccl_all_reduce_busbw_gbs" in w for w in summary.warnings)


def test_nodes_pair_addresses_in_written_order() -> None:
    doc: dict[str, Any] = yaml.safe_load(starter("lab", 3))
    doc["node_groups"][1]["addresses"] = "198.18.0.30,198.18.0.[21-22]"
    got = [(n.name, n.address) for n in nodes(_cluster(doc)) if n.group == "gpu"]
    assert got == [("gpu001", "198.18.0.30"), ("gpu002", "198.18.0.21"), ("gpu003", "198.18.0.22")]
