"""Benchmark: judge the raw outputs of 1,024 simulated 8-GPU nodes and write every report.

Run: .venv/bin/python benchmarks/judge_1024.py [--nodes N] [--jobs J]

Each simulated node's outputs are real captures from tests/fixtures (HGX H100 `nvidia-smi -q`,
`topo -m`, `topo -p2p r`, `nvlink -s`, NDR `ibstat`, nccl-tests all_reduce, all_gather,
reduce_scatter and alltoall (sendrecv from the lab's stand-in: no whole real run was found),
nvbandwidth, perftest ib_write_bw and ib_write_lat, Fabric Manager status, kernel log, lspci,
nvbandwidth GPU <-> GPU), with
faults on some nodes
(a node whose kernel log has Xid 48/63/94, a node with an A100 NV12 matrix, an unreachable
node). Measures, in this process:
loading the bundle, parsing and judging every node (all checks, fleet-relative judgement), and
rendering results.json, JUnit XML, the Prometheus textfile and the HTML report. Budget: 10 s on
a 2-core machine; target: half of it.

Baseline, measured in the same run on the same files: reading every raw file of the bundle and
JSON-decoding its meta.json files, then JSON-encoding and writing a results.json of the same
number of checks (what any tool that reads the bundle and writes a report must do at least).
The benchmark prints both and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpuctl.config import load_cluster_text
from gpuctl.lab.sim import perf as sim_perf
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.starter import starter
from gpuctl.validation.capture import capture_output
from gpuctl.validation.reports.write import write_reports
from gpuctl.validation.suite import fewer_gc_passes, judge_directory

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
BUDGET_S = 10.0
TARGET_S = BUDGET_S / 2

NVLINK_E = "nvidia-smi/nvlink-e-a100-sxm4-40gb-gpu0-12links-535-tabs-blank-lines.txt"
GOOD = {
    "smi-q": "nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt",
    "topo": "topo/nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.txt",
    "topo-p2p": "topo/nvsmi-topo-p2p-r-h100-8gpu-all-ok-spaces.txt",
    "nvlink": "nvidia-smi/nvlink-status-a100-8gpu-space-indent.txt",
    "ibstat": "ib/ibstat-h100-ib-ndr400-all-active-space-indent.txt",
    "nccl": "nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt",
    "fabricmanager": (
        "fabric-manager/systemctl-status-fabricmanager-active-running-h100-rhel-ai.txt"
    ),
    "xid": "kernel-xid/journal-kernel-xid-45-caused-by-previous-xid-145-149.txt",
    "dcgm-diag": "dcgm/dcgmi-diag-r4-pass-blacklist-era.txt",
    "uname": "kernel/uname-r-firecracker-guest-6.18.txt",
    "slurmd-conf": "slurm/slurmd-C-p5-48xlarge-nodename-line.txt",
    # the other collectives of the standard level (8x A100 runs)
    "nccl.all_gather": "nccl-tests/all-gather-perf-a100-sxm4-40gb-8gpu-validation0.txt",
    "nccl.reduce_scatter": "nccl-tests/reduce-scatter-perf-a100-sxm4-40gb-8gpu-validation0.txt",
    "nccl.alltoall": "nccl-tests/alltoall-perf-a100-sxm4-40gb-8gpu-validation0.txt",
    # host <-> GPU copies per GPU (8 GPUs on PCIe Gen5 x16, above the H100's 48 GB/s floor)
    "nvbandwidth": "nvbandwidth/nvbandwidth-rtx5090-8gpu-unknown-version-h2d-d2h-partial.txt",
    # the PCIe tree (lspci -vvv): one PEX890xx switch of a real HGX H100 with its GPU and
    # adapters, as the bridges' and the adapters' output (a subset of each, as filtered)
    "lspci.bridges": "pci/lspci-vvv-hgx-h100-one-pex890xx-switch-gpu-cx7-cx6dx-excerpt.txt",
    "lspci.nics": "pci/lspci-vvv-hgx-h100-one-pex890xx-switch-gpu-cx7-cx6dx-excerpt.txt",
    # both reads of the NVLink error counters (no growth: the same capture twice)
    "nvlink-errors.start": NVLINK_E,
    "nvlink-errors.end": NVLINK_E,
}
PERFQUERY = "ib/counters/perfquery-x-rhel75-lid10-port1-all-zero.txt"
D2D_READ = "nvbandwidth/nvbandwidth-h100-8gpu-v0.4-azure-ndv5-d2d-read-ce.txt"
D2D_WRITE = "nvbandwidth/nvbandwidth-h100-8gpu-v0.10-d2d-write-ce.txt"
# the node's clock (GNU date on a lab node) and the window gpuctl records around it
CLOCK = "node/date-epoch-ns-debian13-lab-node.txt"
PERFTEST = "perftest/ib-write-bw-dgx-spark-rocep1s0f1-4qp-rdma-cm-gbits-client.txt"
LATENCY = "perftest/ib-write-lat-dgx-spark-rocep1s0f1-rdma-cm-client-2B.txt"  # p99 1.57 us
FAULTY = {
    "xid": "kernel-xid/dmesg-iso-xid-48-63-94-dbe-row-remap.txt",
    "topo": "topo/nvsmi-topo-m-a100-40gb-8gpu-azure-ndv4-blank-nic-names-ansi.txt",
}
HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]


def body(rel: str) -> str:
    return capture_output(FIX / rel)


def make_bundle(nodes: int, directory: Path) -> str:
    doc = yaml.safe_load(starter("hgx-h100", nodes))
    doc["node_groups"][1]["nics"][0]["devices"] = "mlx5_[0-1,4-9]"  # as the real ibstat lists
    # the real node's topo -m (Princeton's HGX H100) is not rail-aligned: six adapters, two
    # behind GPU0's switch; its operators would not declare rails
    doc["node_groups"][1]["nics"][0]["rails"] = False
    doc["software"]["driver"] = {"branch": "565", "version": "565.57.01"}  # as the -q capture
    # as the slurmd -C capture (p5.48xlarge: 2 x 48 x 2 CPUs, 2047961 MiB)
    doc["node_groups"][1]["cpu"] = {"sockets": 2, "cores_per_socket": 48, "threads_per_core": 2}
    # the captured nccl/perftest runs are from smaller systems: hold them to their own floors
    doc["validation"]["thresholds"] = {
        **{f"nccl_{c}_busbw_gbs": 200 for c in ("all_reduce", "all_gather", "reduce_scatter")},
        **{f"nccl_{c}_busbw_gbs": 200 for c in ("alltoall", "sendrecv")},
        "ib_write_bw_gbps": 90,
    }
    text = yaml.safe_dump(doc, sort_keys=False)
    cluster = load_cluster_text(text, "bench")
    good = {kind: body(rel) for kind, rel in GOOD.items()}
    # no whole real sendrecv_perf run was found (tests/fixtures/ADDED.md): the lab stand-in's
    # output for an 8x A100 node, in nccl-tests 2.17.9's layout
    # GPU <-> GPU copies over NVSwitch: two real 8x H100 runs, read_ce then write_ce, as the
    # probe's one run of both testcases prints them
    good["nvbandwidth.d2d"] = body(D2D_READ) + body(D2D_WRITE)
    good["nccl.sendrecv"] = sim_perf.nccl_perf(
        sim_profiles.load("a100-hdr"), {}, "gpu001", sim_perf.NcclArgs(8, 8 << 30, 2, 8), "sendrecv"
    )
    faulty = {kind: body(rel) for kind, rel in FAULTY.items()}
    perf = body(PERFTEST)
    lat = body(LATENCY)
    counters = body(PERFQUERY)
    clock = body(CLOCK)
    epoch = float(clock)
    meta = {"probes": {"clock": {"sent_at": epoch - 0.02, "received_at": epoch + 0.02}}}
    names = [n for g in cluster.node_groups for n in g.node_names()]
    for i, name in enumerate(names):
        folder = directory / name
        folder.mkdir(parents=True)
        if i % 257 == 5:
            (folder / "meta.json").write_text(json.dumps({"unreachable": "ssh: timed out"}))
            continue
        for kind, text_ in good.items():
            if i % 97 == 3 and kind in faulty:
                text_ = faulty[kind]
            (folder / f"{kind}.txt").write_text(text_, encoding="utf-8")
        for hca in HCAS:
            (folder / f"perftest-{hca}.txt").write_text(perf, encoding="utf-8")
            (folder / f"perftest.lat.{hca}.txt").write_text(lat, encoding="utf-8")
            for read in ("start", "end"):  # port counters, no growth: the same capture twice
                (folder / f"perfquery.{read}.{hca}.txt").write_text(counters, encoding="utf-8")
        (folder / "clock.txt").write_text(clock, encoding="utf-8")
        (folder / "meta.json").write_text(json.dumps(meta))
    return text


def baseline(bundle_dir: Path, checks: int, out: Path) -> float:
    """Seconds to read and decode every raw file, JSON-decode the meta.json files, and JSON-encode
    and write one record per check (the least a reader of the bundle does)."""
    start = time.perf_counter()
    size = 0
    for folder in sorted(bundle_dir.iterdir()):
        for path in sorted(folder.iterdir()):
            text = path.read_text(encoding="utf-8")
            size += len(text)
            if path.name == "meta.json":
                json.loads(text)
    rows = [
        {"check": "x", "node": "n", "verdict": "ok", "message": "m", "measured": i}
        for i in range(checks)
    ]
    out.write_text(json.dumps({"rows": rows, "size": size}), encoding="utf-8")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes for judging (default: the cores)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bundle_dir = Path(tmp) / "bundle"
        text = make_bundle(args.nodes, bundle_dir)
        cluster = load_cluster_text(text, "bench")
        names = [n for g in cluster.node_groups for n in g.node_names()]
        start = time.perf_counter()
        # reading, parsing and judging happen together: each worker reads its nodes' folders
        report = judge_directory(
            cluster, bundle_dir, generated_at="2026-12-01T00:00:00Z", jobs=args.jobs
        )
        t_judge = time.perf_counter()
        out = Path(tmp) / "out"
        out.mkdir()
        with fewer_gc_passes():
            files = [
                ("json", out / "results.json"),
                ("junit", out / "results.xml"),
                ("prom", out / "gpuctl.prom"),
                ("html", out / "report.html"),
            ]
            write_reports(report, files, jobs=args.jobs)
        end = time.perf_counter()
        checks = sum(len(n.checks) for n in report.nodes)
        s = report.summary()
        sizes = {p.name: p.stat().st_size for p in out.iterdir()}
        base = baseline(bundle_dir, checks, Path(tmp) / "baseline.json")
    total = end - start
    verdict = (
        "within"
        if total <= TARGET_S
        else "within budget, over target"
        if total <= BUDGET_S
        else "OVER"
    )
    print(
        f"nodes={len(names)} jobs={args.jobs} checks={checks} failed={s['failed']} "
        f"read+parse+judge={t_judge - start:.2f}s "
        f"reports={end - t_judge:.2f}s"
    )
    print(f"report sizes: {', '.join(f'{k} {v // 1024} KiB' for k, v in sorted(sizes.items()))}")
    print(
        f"baseline (read + json-decode the raw files, json-encode {checks} records)="
        f"{base:.2f} s; gpuctl/baseline={total / base:.1f}"
    )
    print(
        f"total={total:.2f} s budget={BUDGET_S:.0f} s target={TARGET_S:.0f} s ({verdict}, "
        f"total/budget={total / BUDGET_S:.2f})"
    )
    return 0 if total <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
