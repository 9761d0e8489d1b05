"""Benchmark: load and render a 4,096-node cluster.yml (budget: 3 s on a 2-core machine).

Run: .venv/bin/python benchmarks/render_4096.py [--nodes N] [--repeat R]

Measures, in this process: parsing + validating the cluster.yml (all cross-field rules), and
rendering every file (inventory, group_vars, one host_vars file per node, ansible.cfg, slurm.conf,
gres.conf, cgroup.conf, topology.conf) written to a temporary directory. Prints each repeat and
the best and median times; exits 1 when the median is over the budget.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpuctl.config import load_cluster
from gpuctl.render import render_cluster
from gpuctl.starter import starter

BUDGET_S = 3.0


def make_cluster_yml(nodes: int, path: Path) -> None:
    doc = yaml.safe_load(starter("hgx-h100", nodes))
    # one management address per node, as a real site would give
    doc["node_groups"][1]["addresses"] = ",".join(
        f"10.{16 + i // 65536}.{(i // 256) % 256}.{i % 256}" for i in range(1, nodes + 1)
    )
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "cluster.yml"
        make_cluster_yml(args.nodes, src)
        times: list[float] = []
        files = 0
        for i in range(args.repeat):
            out = Path(tmp) / f"out{i}"
            start = time.perf_counter()
            cluster = load_cluster(src)
            result = render_cluster(cluster, out)
            times.append(time.perf_counter() - start)
            files = len(result.written)
            print(f"run {i + 1}: {times[-1]:.3f} s")
    median = statistics.median(times)
    verdict = "within" if median <= BUDGET_S else "OVER"
    print(
        f"nodes={args.nodes} files={files} best={min(times):.3f} s median={median:.3f} s "
        f"budget={BUDGET_S:.1f} s ({verdict} budget, median/budget={median / BUDGET_S:.2f})"
    )
    return 0 if median <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
