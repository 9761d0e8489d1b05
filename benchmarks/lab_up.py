"""Benchmark: how long `gpuctl lab up` takes (needs root; takes the lab down first and after).

Run: .venv/bin/python benchmarks/lab_up.py [--nodes 4] [--cold] [--big 8]

- cached: base image present; budget 60 s until every node answers SSH with systemd `running`
- --cold: the base image is removed first, so debootstrap runs too; budget 300 s
- --big N: also bring up an N-node lab and report its time (it must run on 2 cores / 24 GiB)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from gpuctl.lab import lab

BUDGET_CACHED_S = 60.0
BUDGET_COLD_S = 300.0


def timed_up(nodes: int) -> float:
    lab.down()
    start = time.perf_counter()
    result = lab.up(nodes - 1)
    seconds = time.perf_counter() - start
    assert all(n.state == "running" for n in result.status.nodes)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cold", action="store_true", help="rebuild the base image first")
    parser.add_argument("--big", type=int, default=0, help="also time an N-node lab")
    args = parser.parse_args()
    ok = True
    try:
        if args.cold:
            lab.down()
            shutil.rmtree(lab.lab_dir() / "base", ignore_errors=True)
            cold = timed_up(args.nodes)
            ok &= cold <= BUDGET_COLD_S
            print(
                f"cold  lab up --nodes {args.nodes}: {cold:.1f} s (budget {BUDGET_COLD_S:.0f} s,"
                f" ratio {cold / BUDGET_COLD_S:.2f})"
            )
        cached = timed_up(args.nodes)
        ok &= cached <= BUDGET_CACHED_S
        print(
            f"cached lab up --nodes {args.nodes}: {cached:.1f} s (budget "
            f"{BUDGET_CACHED_S:.0f} s, ratio {cached / BUDGET_CACHED_S:.2f})"
        )
        if args.big:
            big = timed_up(args.big)
            print(f"cached lab up --nodes {args.big}: {big:.1f} s")
    finally:
        lab.down()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
