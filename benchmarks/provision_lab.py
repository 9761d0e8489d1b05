"""Benchmark: `gpuctl provision` against plain `ansible-playbook`, same lab, same playbook.

Run (root; takes the lab down first and after): .venv/bin/python benchmarks/provision_lab.py

Both run playbooks/site.yml with the inventory gpuctl render writes for the lab, the same
ansible.cfg, roles path and host key checking; plain ansible-playbook runs with the default
output callback, gpuctl through ansible-runner with its event processing and run directory.

Sequence (a 3-node lab each time):
  lab 1: gpuctl full run, gpuctl idempotent run, plain idempotent run
  lab 2: plain full run,  plain idempotent run,  gpuctl idempotent run
gpuctl's full run comes first, so any apt cache warming favours the plain run.

Targets: full-run wall time ratio gpuctl / plain <= 1.05; idempotent ratio printed (same 1.05
target); gpuctl's idempotent run < 40% of its full run. Exit 1 when a target is missed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuctl.config import load_cluster
from gpuctl.lab import lab
from gpuctl.provision import provision, state_dir_for
from gpuctl.render import render_cluster
from gpuctl.resources import playbooks_dir

RATIO_MAX = 1.05
IDEMPOTENT_SHARE_MAX = 0.40


def _fresh_lab(work: Path) -> Path:
    lab.down()
    lab.up(compute_nodes=2)
    cluster = work / "cluster.yml"
    shutil.copy(lab.lab_dir() / "cluster.yml", cluster)
    return cluster


def _plain(cluster: Path, work: Path) -> float:
    """ansible-playbook with gpuctl's rendered inventory, as an operator would run it."""
    rendered = work / "plain-inventory"
    render_cluster(load_cluster(cluster), rendered)
    shutil.copy(lab.known_hosts(), rendered / "known_hosts")
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(rendered / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(playbooks_dir() / "roles"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
    }
    start = time.perf_counter()
    res = subprocess.run(  # noqa: S603 - argv list: our own ansible-playbook
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(rendered / "inventory.yml"),
            str(playbooks_dir() / "site.yml"),
        ],
        cwd=rendered,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-4000:])
        raise SystemExit(f"plain ansible-playbook failed (rc {res.returncode})")
    return seconds


def _gpuctl(cluster: Path) -> float:
    start = time.perf_counter()
    result = provision(
        load_cluster(cluster), cluster_file=cluster, state_dir=state_dir_for(cluster)
    )
    seconds = time.perf_counter() - start
    if result.record.status != "successful":
        raise SystemExit(f"gpuctl provision {result.record.status}: see {result.run_dir}")
    return seconds


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpuctl-bench-") as tmp:
        work = Path(tmp)
        try:
            cluster = _fresh_lab(work)
            g_full = _gpuctl(cluster)
            g_idem = [_gpuctl(cluster)]
            p_idem = [_plain(cluster, work)]
            cluster = _fresh_lab(work)
            p_full = _plain(cluster, work)
            p_idem.append(_plain(cluster, work))
            g_idem.append(_gpuctl(cluster))
        finally:
            lab.down()
    full_ratio = g_full / p_full
    idem_ratio = statistics.median(g_idem) / statistics.median(p_idem)
    share = g_idem[0] / g_full
    print(f"full run:       gpuctl {g_full:.1f} s, ansible-playbook {p_full:.1f} s")
    print(
        f"idempotent run: gpuctl {', '.join(f'{s:.1f}' for s in g_idem)} s, "
        f"ansible-playbook {', '.join(f'{s:.1f}' for s in p_idem)} s"
    )
    print(f"ratio gpuctl / ansible-playbook, full run: {full_ratio:.3f} (target <= {RATIO_MAX})")
    print(f"ratio gpuctl / ansible-playbook, idempotent run: {idem_ratio:.3f}")
    print(f"gpuctl idempotent / full run: {share:.2f} (target < {IDEMPOTENT_SHARE_MAX})")
    ok = full_ratio <= RATIO_MAX and share < IDEMPOTENT_SHARE_MAX
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
