"""benchmarks/judge_1024.py measures what it says only when its healthy nodes pass: a kind the
standard level collects and its bundle lacks makes every node UNKNOWN (failed=1024 twice: the
clock reading, then topo-p2p), and the benchmark then times the failure path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from helpers import ROOT

from gpuctl.config import load_cluster_text
from gpuctl.validation.suite import judge_directory


def test_only_the_benchmarks_planted_faults_fail(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("judge_1024", ROOT / "benchmarks/judge_1024.py")
    assert spec is not None
    assert spec.loader is not None
    judge_1024 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(judge_1024)
    text = judge_1024.make_bundle(8, tmp_path)
    report = judge_directory(load_cluster_text(text, "bench"), tmp_path)
    failed = {
        n.node: sorted({c.check for c in n.checks if c.verdict.value in ("fail", "unknown")})
        for n in report.nodes
    }
    # node 3 (i % 97 == 3) carries the faulty kernel log and A100 matrix, node 5 is unreachable
    assert {n: c for n, c in failed.items() if c} == {
        "gpu003": ["topology.nvlink", "xid"],
        "gpu005": ["node.reachable"],
    }
