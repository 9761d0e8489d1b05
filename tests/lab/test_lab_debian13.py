"""Debian 13 nodes, three hardware profiles, Slurm from its own repository, no proxy on the nodes.

One lab (`gpuctl lab up --os debian13 --profile a100-hdr:2 --profile l40s-pcie:2 --profile
single-gpu:1`) shows what the default lab (Debian 12, hgx-h100-ndr, see
test_lab_provision.py) does not:

- a second node OS end to end: provision, a second run that changes nothing (the controller
  and one node of each group), acceptance,
  validation; Debian 13's Slurm (24.11, whose slurmd unit no longer waits for slurm.conf);
- Slurm from a package repository other than the OS's: `package_sources.slurm` names the lab's
  Slurm repository (gpuctl/lab/slurm_repo.py: Debian's real .debs under SchedMD's package names,
  `packages: schedmd`), the roles add it and pin Slurm to it; the OS archive has no such names,
  and the lab repository's log shows each node fetching them from there;
- nodes that reach no Debian archive until gpuctl gives them `package_sources.os_mirror`
  (the lab's apt-cacher-ng used as a mirror): the lab sets no proxy and no source of its own;
- three more lab hardware profiles (A100 on HDR InfiniBand, L40S on RoCE, one RTX 6000 Ada
  without a fabric NIC) provisioned, each node group on its own fabric, and the mixed cluster
  validated at `standard` in one run with zero failed checks (the fleet judge compares like
  with like; two nodes per group are too few peers, a warning); one slow node in each of the
  A100 and L40S groups fails exactly those two nodes; RoCE QoS and NCCL's traffic class on a
  RoCE node. The fifth
  profile, `a100-roce`, is left out to keep CI under its hour: its GPUs are a100-hdr's and its
  fabric kind is l40s-pcie's (RoCE, the same roce_qos role and NCCL settings); only its
  rendering is unit-tested.

The GPUs, HCAs and their tools are the lab's SIMULATED stand-ins (docs/lab-hardware.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lab_helpers import GPUCTL, gpuctl, on, sh

from gpuctl.lab import lab, slurm_repo

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]

PROFILES = ("a100-hdr:2", "l40s-pcie:2", "single-gpu:1")
GROUPS = {
    "a100_hdr": ("gpu001", "gpu002"),
    "l40s_pcie": ("gpu003", "gpu004"),
    "single_gpu": ("gpu005",),
}
COMPUTE = tuple(n for nodes in GROUPS.values() for n in nodes)
NODES = ("ctl01", *COMPUTE)
SLURM = slurm_repo.VERSIONS["trixie"]


@dataclass(frozen=True)
class Trixie:
    cluster: Path
    first: dict[str, Any]  # run record of the first `gpuctl provision --json`
    before: dict[str, str]  # node -> `apt-get update` output before provisioning
    log_start: int  # size of the lab repository's log before provisioning


def _repo_log() -> Path:
    return lab.lab_dir() / "run" / "repo-http.log"


@pytest.fixture(scope="module")
def trixie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trixie]:
    lab.down()
    lab.up(os_name="debian13", profiles=list(PROFILES))
    state = tmp_path_factory.mktemp("debian13-lab")
    cluster = state / "cluster.yml"
    shutil.copy(lab.lab_dir() / "cluster.yml", cluster)
    # a fresh node reaches no Debian archive: no proxy, no mirror, no route out of the bridge
    before = {
        n: sh(lab.address_of(n), "timeout 60 apt-get -q update 2>&1; echo rc=$?").stdout
        for n in ("ctl01", "gpu001")
    }
    log = _repo_log()
    start = log.stat().st_size if log.is_file() else 0
    first = gpuctl("provision", str(cluster), "--json")
    assert first.returncode == 0, first.stderr[-5000:]
    yield Trixie(cluster, json.loads(first.stdout), before, start)
    lab.down()


def test_a_fresh_node_reaches_no_debian_archive_until_provisioned(trixie: Trixie) -> None:
    for out in trixie.before.values():
        assert "deb.debian.org" in out, out
        # apt-get update may still exit 0 ("W: Failed to fetch"): what it says is the proof
        assert "Failed to fetch" in out or "Could not" in out or "unreachable" in out, out
    for node in NODES:
        # nothing of the lab's own: no proxy; the OS sources are cluster.yml's mirror
        assert on(node, "apt-config dump | grep -ci proxy || true").strip() == "0", node
        sources = on(node, "cat /etc/apt/sources.list")
        mirror = "http://198.18.0.1:3142/deb.debian.org/debian"
        assert f"deb {mirror} trixie main non-free-firmware" in sources, sources
        assert f"deb {mirror} trixie-updates main non-free-firmware" in sources, sources
        security = "http://198.18.0.1:3142/security.debian.org/debian-security"
        assert f"deb {security} trixie-security main" in sources, sources
        listed = on(node, "ls /etc/apt/sources.list.d").split()
        assert not [f for f in listed if f.endswith(".sources")], listed


def test_provision_on_debian13_runs_jobs_on_every_profile(trixie: Trixie) -> None:
    hosts = trixie.first["hosts"]
    assert set(hosts) == set(NODES)
    assert {h: s["failed"] + s["unreachable"] for h, s in hosts.items()} == dict.fromkeys(NODES, 0)
    assert on("ctl01", ". /etc/os-release; echo $VERSION_ID").strip() == "13"
    assert on("ctl01", "sinfo --version").split()[-1] == SLURM
    # the gate read the node's cgroup file system (the lab's containers see the host's, a v1
    # hierarchy, and run no cgroup plugin: proctrack/linuxproc); the v2 refusal is unit-tested
    assert on("gpu001", "stat -fc %T /sys/fs/cgroup").strip() in ("tmpfs", "cgroup2fs")
    idle = on("ctl01", 'sinfo -h -N -o "%N %T %G"').split("\n")
    states = {line.split()[0]: line.split()[1:] for line in idle if line.strip()}
    assert {n: s[0] for n, s in states.items()} == dict.fromkeys(COMPUTE, "idle"), states
    assert states["gpu001"][1] == "gpu:a100:8"
    assert states["gpu003"][1] == "gpu:l40s:8"
    assert states["gpu005"][1] == "gpu:rtx6000ada:1"
    ran = on("ctl01", f"srun -N{len(COMPUTE)} -t 1 hostname", timeout=120).split()
    assert sorted(ran) == list(COMPUTE)


# one node of each node group (the nodes of a group get the same tasks) and the controller:
# the second run of all six nodes took 290 s of the CI budget on two cores
AGAIN = ("ctl01", "gpu001", "gpu003", "gpu005")


def test_second_provision_changes_nothing(trixie: Trixie) -> None:
    again = gpuctl("provision", str(trixie.cluster), "--limit", ",".join(AGAIN), "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    record = json.loads(again.stdout)
    assert {h: s["changed"] for h, s in record["hosts"].items()} == dict.fromkeys(AGAIN, 0)


def test_slurm_comes_from_the_separate_repository_under_schedmds_names(trixie: Trixie) -> None:
    # the OS archive has no slurm-smd-*: every node that has them took them from the lab's
    # Slurm repository, which package_sources.slurm names, and has none of Debian's names
    daemons = {"ctl01": "slurm-smd-slurmctld"} | dict.fromkeys(COMPUTE, "slurm-smd-slurmd")
    for node, daemon in daemons.items():
        listed = on(node, 'dpkg -l "slurm*" "libslurm*" 2>/dev/null || true')
        installed = {
            line.split()[1].split(":")[0]: line.split()[2]
            for line in listed.splitlines()
            if line.startswith(("ii ", "hi "))
        }
        for package in (daemon, "slurm-smd-client", "slurm-smd"):
            assert installed.get(package, "").startswith(f"{SLURM}-"), (node, package)
        debian = set(slurm_repo.RENAMES) & set(installed)
        assert not debian, (node, debian)
        held = on(node, "apt-mark showhold").split()
        assert {daemon, "slurm-smd-client", "slurm-smd"} <= set(held), (node, held)
    fetched = _repo_log().read_text(encoding="utf-8", errors="replace")[trixie.log_start :]
    for package in ("slurm-smd-slurmctld", "slurm-smd-slurmd", "slurm-smd-client", "slurm-smd"):
        # a flat repository's files are ./NAME: the nodes ask for /slurm/./NAME_VERSION_amd64.deb
        assert re.search(rf"GET /slurm/(\./)?{package}_{re.escape(SLURM)}-", fetched), package


def test_acceptance_passes_on_debian13(trixie: Trixie, tmp_path: Path) -> None:
    res = subprocess.run(
        [GPUCTL, "acceptance", str(trixie.cluster), "--state-dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]


def _bad(report: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    return {
        n["node"]: [
            (c["check"], c["message"]) for c in n["checks"] if c["verdict"] in ("fail", "unknown")
        ]
        for n in report["nodes"]
    }


def _validate(cluster: Path, out: Path) -> tuple[int, dict[str, Any], str]:
    """`gpuctl validate CLUSTER --level standard --json` of the whole mixed cluster."""
    res = subprocess.run(
        [GPUCTL, "validate", str(cluster), "--level", "standard", "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return res.returncode, json.loads(res.stdout), res.stderr


def _fleet(report: dict[str, Any], check: str) -> dict[str, list[tuple[str, str]]]:
    return {
        n["node"]: [(c["verdict"], c["message"]) for c in n["checks"] if c["check"] == check]
        for n in report["nodes"]
    }


# each node group of this lab has two nodes on a fabric of its own: fewer than the fleet
# judge's minimum of three peers (docs/validate.md, "Fleet-relative checks: like with like")
PEERS_OF_TWO = tuple(n for g in ("a100_hdr", "l40s_pcie") for n in GROUPS[g])


def test_the_mixed_cluster_validates_at_standard_with_zero_failed_checks(
    trixie: Trixie, tmp_path: Path
) -> None:
    """One validate of every node: A100 on HDR, L40S on RoCE and one RTX 6000 Ada are judged
    like with like (one median over all of them failed the L40S nodes)."""
    code, report, err = _validate(trixie.cluster, tmp_path / "bundle")
    assert {n["node"] for n in report["nodes"]} == set(NODES)
    assert _bad(report) == {n: [] for n in NODES}, err[-2000:]
    assert code == 0
    for node in COMPUTE:
        checks = {c["check"] for n in report["nodes"] if n["node"] == node for c in n["checks"]}
        assert {"gpu.count", "gpu.driver", "dcgm.diag", "xid"} <= checks, (node, checks)
        if node in PEERS_OF_TWO:  # single_gpu: one GPU, no fabric NIC: no NCCL ring, no pair
            assert {"nccl.busbw", "ib.write_bw", "ib.port.state"} <= checks, (node, checks)
        if node in GROUPS["l40s_pcie"]:  # RoCE: the ports' hw counters, read twice
            assert "roce.port.errors" in checks, (node, checks)
    # RoCE: ib_write_bw ran on the lab cluster.yml's fabrics[].gid_index (-x 3): the stand-in
    # prints the index -x gives it and 0 without, as perftest documents
    for node in GROUPS["l40s_pcie"]:
        runs = sorted((tmp_path / "bundle" / node).glob("perftest-*.txt"))
        assert runs, node
        for run in runs:
            assert "GID index       : 3\n" in run.read_text(), (node, run.name)
        # GPUDirect RDMA: each GPU's memory through its nearest RoCE adapter, on the same GID
        # index, through DMA-BUF (the lab's inbox stack has no peer memory API)
        gdr = sorted((tmp_path / "bundle" / node).glob("perftest.gdr.gpu*.txt"))
        assert gdr, node
        for run in gdr:
            text = run.read_text()
            assert "GID index       : 3\n" in text, (node, run.name)
            assert "Calling ibv_reg_dmabuf_mr(" in text, (node, run.name)
    for node in PEERS_OF_TWO:
        gdr_checks = [
            c["verdict"]
            for n in report["nodes"]
            if n["node"] == node
            for c in n["checks"]
            if c["check"] == "gpudirect.write_bw"
        ]
        assert gdr_checks, node
        assert set(gdr_checks) == {"ok"}, (node, gdr_checks)
    for check in ("nccl.busbw.fleet", "ib.write_bw.fleet"):
        fleet = _fleet(report, check)
        for node in PEERS_OF_TWO:
            [(verdict, message)] = fleet[node]
            assert verdict == "warn", (node, check, message)
            assert message.startswith("not enough peers: 2 nodes in "), (node, check, message)
            assert message.endswith("(at least 3 needed)"), (node, check, message)


def test_one_slow_node_in_each_group_fails_exactly_those_two(
    trixie: Trixie, tmp_path: Path
) -> None:
    """NCCL at half speed on one node of each two-node group: each falls below its group's
    busbw floors, all_reduce's (A100: 228 GB/s from the catalog; L40S: the lab's cluster.yml,
    90 % of the profile) and those of the other collectives; its peer, on the same fabric,
    passes."""
    slow = ("gpu001", "gpu003")  # a100_hdr, l40s_pcie
    for node in slow:
        lab.inject_fault(node, "nccl_slow", "0.5")
    # in the same run: a RoCE port of gpu003 whose local ACK timeouts grow with every
    # ib_write_bw over it (rdma statistic, read before and after the tests)
    lab.inject_fault("gpu003", "roce_errors", "mlx5_1:local_ack_timeout_err:25")
    try:
        code, report, err = _validate(trixie.cluster, tmp_path / "bundle")
    finally:
        for node in slow:
            lab.clear_faults(node)
    assert code == 1, err[-2000:]
    assert sorted(n["node"] for n in report["nodes"] if n["failed"]) == list(slow)
    bad = _bad(report)
    for node in slow:
        # every NCCL collective the standard level runs is at half speed: each of their busbw
        # checks fails, and nothing else on the node does
        nccl = sorted(
            c["check"]
            for n in report["nodes"]
            if n["node"] == node
            for c in n["checks"]
            if c["check"].startswith("nccl.") and c["check"].endswith("busbw")
        )
        assert "nccl.busbw" in nccl, (node, nccl)
        assert len(nccl) > 1, (node, nccl)
        assert sorted(check for check, _ in bad[node]) == nccl, (node, bad[node])
    # the RoCE port's growing local ACK timeouts: a degradation (WARN, data/counters.yml), on
    # gpu003's mlx5_1 alone
    warned = {
        (n["node"], c.get("subject")): c["message"]
        for n in report["nodes"]
        for c in n["checks"]
        if c["check"] == "roce.port.errors" and c["verdict"] == "warn"
    }
    assert list(warned) == [("gpu003", "mlx5_1")], warned
    assert "port 1 local_ack_timeout_err +" in warned["gpu003", "mlx5_1"], warned
    assert {n: b for n, b in bad.items() if n not in slow} == {
        n: [] for n in NODES if n not in slow
    }


def test_roce_qos_and_nccls_traffic_class_on_a_roce_node(trixie: Trixie) -> None:
    node = "gpu003"  # l40s-pcie: 2x 100 GbE RoCE
    # NCCL does not use RDMA-CM: without NCCL_IB_TC its traffic rides class 0; DSCP 26 (the
    # lossless class of priority 3) << 2 = traffic class 104
    conf = on(node, "cat /etc/nccl.conf").split()
    assert "NCCL_IB_TC=104" in conf
    assert "NCCL_IB_GID_INDEX=3" in conf  # the lab cluster.yml's fabrics[].gid_index
    assert "NCCL_IB_TC" not in on("gpu001", "cat /etc/nccl.conf")  # InfiniBand: none
    # the QoS script, run as the role installed it, finds nothing to change on the SIMULATED
    # ports (gpuctl/lab/sim/qos.py, sysroot.py): trust dscp, PFC on priority 3, RDMA-CM's ToS
    res = sh(lab.address_of(node), "/usr/local/sbin/gpuctl-roce-qos check")
    assert res.returncode == 0, res.stdout + res.stderr
    qos = on(node, "mlnx_qos -i $(ls /var/lib/gpuctl-lab-sim/sysroot/sys/class/net | head -1)")
    assert "Priority trust state: dscp" in qos, qos
    enabled = next(line for line in qos.splitlines() if line.strip().startswith("enabled"))
    assert enabled.split()[1:] == ["0", "0", "0", "1", "0", "0", "0", "0"], qos
