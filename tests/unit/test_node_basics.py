"""Node basics that break jobs (gpuctl issue 18, point 6): the hardware `slurmd -C` finds
against the NodeName line gpuctl wrote (node.cpus, node.memory), and the file systems
cluster.yml requires (node.mount, from `df`), gpuctl/validation/judges/node.py.

Readings: the real `slurmd -C` captures (p5.48xlarge, an OpenHPC node) and `df` as a lab node
printed it (tests/fixtures/node/); then whole validations of the simulated cluster, one node
of three faulty."""

# /tmp and /dev/shm here are mount points a node must have (data for df), not temporary files
# ruff: noqa: S108

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT
from test_collect import FakeConnector, Sim, fails_only, slurmd_c

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.errors import ConfigError
from gpuctl.validation.api import validate
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.node import judge_mounts, judge_node_resources
from gpuctl.validation.probes import probes_for
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures"
P5 = capture_output(FIX / "slurm/slurmd-C-p5-48xlarge-nodename-line.txt")  # 2x48x2, 2047961 MB
OPENHPC = capture_output(FIX / "slurm/slurmd-C-openhpc-centos-2x8-uptime-line.txt")  # 2x8x1
LAB_DF = capture_output(FIX / "node/df-output-file-debian13-lab-node-overlay-tmpfs.txt")
HOST_DF = capture_output(FIX / "node/df-output-file-debian12-tmp-not-mounted-missing-path.txt")


def _cluster(cluster_yml: Path, edit: Any) -> Any:
    doc = yaml.safe_load(cluster_yml.read_text(encoding="utf-8"))
    edit(doc)
    return load_cluster_text(yaml.safe_dump(doc), "cluster.yml")


def _resources(
    cluster_yml: Path, cpu: tuple[int, int, int], memory_mb: int, text: str, rc: int = 0
) -> dict[str, CheckResult]:
    def edit(doc: dict[str, Any]) -> None:
        s, c, t = cpu
        doc["node_groups"][1]["cpu"] = {"sockets": s, "cores_per_socket": c, "threads_per_core": t}
        doc["node_groups"][1]["memory_mb"] = memory_mb
        doc["slurm"]["gres_autodetect"] = "nvml"  # the GPUs' sockets, for a 2-socket layout

    exp = expectations(_cluster(cluster_yml, edit))["gpu001"]
    results = judge_node_resources(exp, {"slurmd-conf": ProbeOutput("slurmd-conf", text, rc)})
    assert len(results) == 2
    return {r.check: r for r in results}


def test_the_declared_layout_and_less_memory_than_found_pass(cluster_yml: Path) -> None:
    found = _resources(cluster_yml, (2, 48, 2), 2_000_000, P5)
    assert found["node.cpus"].verdict is Verdict.OK
    assert (found["node.cpus"].measured, found["node.cpus"].expected) == (192, 192)
    assert found["node.memory"].verdict is Verdict.OK
    assert (found["node.memory"].measured, found["node.memory"].expected) == (2047961, 2000000)
    found = _resources(cluster_yml, (2, 8, 1), 128616, OPENHPC)  # UpTime on its own line
    assert {r.verdict for r in found.values()} == {Verdict.OK}


def test_more_memory_declared_than_slurmd_finds_fails(cluster_yml: Path) -> None:
    """A DIMM lost: slurmd registers less than RealMemory and Slurm sets the node INVALID."""
    memory = _resources(cluster_yml, (2, 48, 2), 2_048_000, P5)["node.memory"]
    assert memory.verdict is Verdict.FAIL
    assert memory.message.startswith("slurmd -C finds 2047961 MiB; slurm.conf declares")
    assert "Low RealMemory" in memory.message
    assert "slurm.conf(5)" in str(memory.source)


@pytest.mark.parametrize(
    ("cpu", "verdict", "says"),
    [
        ((2, 56, 2), Verdict.FAIL, "slurmd -C finds 192 CPUs; slurm.conf declares 224"),
        ((2, 24, 2), Verdict.WARN, "Slurm schedules only 96"),
        ((1, 96, 2), Verdict.WARN, "laid out 2 x 48 x 2 (sockets x cores x threads), not 1 x 96"),
        ((2, 96, 1), Verdict.WARN, "laid out 2 x 48 x 2"),  # hyper-threading off in slurm.conf
    ],
)
def test_cpus_other_than_declared(
    cluster_yml: Path, cpu: tuple[int, int, int], verdict: Verdict, says: str
) -> None:
    found = _resources(cluster_yml, cpu, 2_000_000, P5)["node.cpus"]
    assert found.verdict is verdict, found.message
    assert says in found.message


@pytest.mark.parametrize(
    ("text", "rc", "why"),
    [
        ("", 127, "slurmd-conf: exit code 127, output not recognised"),
        (capture_output(FIX / "slurm/slurmd-C-p5-48xlarge.txt"), 0, "output not recognised"),
        (P5, 1, "exited with 1"),
        ("NodeName=x Boards=1 SocketsPerBoard=2 CoresPerSocket=48\n", 0, "no CPUs="),
    ],
)
def test_slurmd_output_that_cannot_be_judged_is_unknown(
    cluster_yml: Path, text: str, rc: int, why: str
) -> None:
    found = _resources(cluster_yml, (2, 48, 2), 2_000_000, text, rc)
    assert found["node.cpus"].verdict is Verdict.UNKNOWN
    assert why in found["node.cpus"].message
    # a cut-off output is never half judged: memory is UNKNOWN too unless it was shown
    assert found["node.memory"].verdict is (
        Verdict.OK if "RealMemory" in text and rc == 0 else Verdict.UNKNOWN
    )


def test_slurmd_runs_on_compute_nodes_at_standard_and_long_only(cluster_yml: Path) -> None:
    exps = expectations(load_cluster(cluster_yml))
    for level, runs in (("quick", False), ("standard", True), ("long", True)):
        kinds = {p.kind for p in probes_for(exps["gpu001"], level)}
        assert ("slurmd-conf" in kinds) is runs, level
    assert exps["ctl01"].slurm_cpu is None  # the controller runs no slurmd
    assert not any(p.kind == "slurmd-conf" for p in probes_for(exps["ctl01"], "standard"))


def test_a_node_with_less_memory_fails_alone_on_node_memory(
    cluster_yml: Path, tmp_path: Path
) -> None:
    """The lab starter declares RealMemory=1024; gpu002's slurmd finds 1000 MiB."""
    fails_only(
        cluster_yml,
        tmp_path / "b",
        {"slurmd": slurmd_c("gpu002", memory_mb=1000)},
        "node.memory",
        level="standard",
    )


def test_a_node_with_a_cpu_lost_fails_alone_on_node_cpus(cluster_yml: Path, tmp_path: Path) -> None:
    fails_only(
        cluster_yml,
        tmp_path / "b",
        {"slurmd": slurmd_c("gpu002", (1, 1, 1))},
        "node.cpus",
        "standard",
    )


# ------------------------------------------------------------------------------------------
# Mounts


def _mounts(cluster_yml: Path, mounts: list[dict[str, Any]], text: str, rc: int = 0) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        doc["node_groups"][1]["validation"]["mounts"] = mounts

    exp = expectations(_cluster(cluster_yml, edit))["gpu001"]
    results = judge_mounts(exp, {"df": ProbeOutput("df", text, rc)})
    assert [r.subject for r in results] == [m["path"] for m in mounts]
    return results


def test_mounted_with_the_type_and_room_asked_for_passes(cluster_yml: Path) -> None:
    results = _mounts(
        cluster_yml,
        [{"path": "/", "min_free_gib": 50}, {"path": "/tmp", "fstype": "tmpfs"}],
        LAB_DF,
    )
    assert [r.verdict for r in results] == [Verdict.OK, Verdict.OK]
    assert results[0].message == "/ mounted (overlay), 72.3 GiB free"
    assert (results[0].measured, results[0].expected) == (72.349, 50)


def test_a_path_that_is_no_mount_of_its_own_fails(cluster_yml: Path) -> None:
    """/tmp on the host is a directory on / (the NFS mount that failed: jobs fill the root)."""
    [tmp] = _mounts(cluster_yml, [{"path": "/tmp"}], HOST_DF, rc=1)
    assert tmp.verdict is Verdict.FAIL
    assert (
        tmp.message == "not mounted: /tmp is a directory on / (ext4), not a file system of its own"
    )


def test_a_path_df_cannot_stat_fails_and_a_missing_row_is_unknown(cluster_yml: Path) -> None:
    [gone] = _mounts(cluster_yml, [{"path": "/nonexistent-scratch"}], HOST_DF, rc=1)
    assert gone.verdict is Verdict.FAIL
    assert "df cannot stat /nonexistent-scratch (exit 1)" in gone.message
    [silent] = _mounts(cluster_yml, [{"path": "/scratch"}], LAB_DF, rc=0)
    assert silent.verdict is Verdict.UNKNOWN


def test_another_type_or_too_little_room_fails(cluster_yml: Path) -> None:
    wrong, full = _mounts(
        cluster_yml,
        [{"path": "/tmp", "fstype": "nfs4"}, {"path": "/dev/shm", "min_free_gib": 3}],
        LAB_DF,
    )
    assert (wrong.verdict, wrong.message) == (Verdict.FAIL, "/tmp is tmpfs, cluster.yml wants nfs4")
    assert full.verdict is Verdict.FAIL
    assert full.message == "/dev/shm: 2.4 GiB free, at least 3 GiB wanted"


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (ProbeOutput("df", None, None, timed_out=True), "df timed out (a network file system"),
        (ProbeOutput("df", None, None, error="could not run: broken pipe"), "could not run"),
        (ProbeOutput("df", "Filesystem 1K-blocks Used Available Use% Mounted on\n"), "default"),
    ],
)
def test_a_df_that_did_not_finish_or_cannot_be_read_is_unknown(
    cluster_yml: Path, output: ProbeOutput, why: str
) -> None:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    results = judge_mounts(exp, {"df": output})
    assert [r.verdict for r in results] == [Verdict.UNKNOWN] * len(exp.mounts)
    assert all(why in r.message for r in results), results


def test_the_lab_starter_asks_for_root_and_tmp_on_every_level(cluster_yml: Path) -> None:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    assert [(m.path, m.fstype, m.min_free_gib) for m in exp.mounts] == [
        ("/", None, 1.0),
        ("/tmp", "tmpfs", None),
    ]
    for level in ("quick", "standard", "long"):
        [df] = [p for p in probes_for(exp, level) if p.kind == "df"]
        assert df.command(exp) == (
            "df",
            "-B1",
            "--output=file,target,fstype,size,avail",
            "--",
            "/",
            "/tmp",
        )


def test_a_group_entry_replaces_the_cluster_wide_one_for_its_path(cluster_yml: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["validation"]["mounts"] = [{"path": "/home", "fstype": "nfs4"}, {"path": "/tmp"}]

    exp = expectations(_cluster(cluster_yml, edit))["gpu001"]
    assert [(m.path, m.fstype) for m in exp.mounts] == [
        ("/home", "nfs4"),
        ("/tmp", "tmpfs"),  # the group's
        ("/", None),
    ]
    assert [m.path for m in expectations(_cluster(cluster_yml, edit))["ctl01"].mounts] == [
        "/home",
        "/tmp",
    ]


@pytest.mark.parametrize(
    "path", ["/home;reboot", "/home/../etc", "home", "/home dir", "/$(id)", "//", "/home/"]
)
def test_a_mount_path_is_a_plain_absolute_path(cluster_yml: Path, path: str) -> None:
    """A path goes into df's argv (quoted word by word): only plain absolute paths load."""
    with pytest.raises(ConfigError) as caught:
        _cluster(cluster_yml, lambda d: d["validation"].__setitem__("mounts", [{"path": path}]))
    assert any("validation.mounts[0].path" in p.path for p in caught.value.problems)


def test_a_path_listed_twice_is_refused(cluster_yml: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _cluster(
            cluster_yml,
            lambda d: d["validation"].__setitem__("mounts", [{"path": "/home"}, {"path": "/home"}]),
        )
    assert any("listed twice" in p.message for p in caught.value.problems)


def test_a_node_whose_scratch_is_not_mounted_fails_alone(cluster_yml: Path, tmp_path: Path) -> None:
    """gpu002's /tmp is a directory on its root file system (the df row of the host capture)."""
    row = next(r for r in HOST_DF.splitlines() if r.split()[0] == "/tmp")
    report = fails_only(cluster_yml, tmp_path / "b", {"df": {"/tmp": row}}, "node.mount")
    gpu002 = next(n for n in report.nodes if n.node == "gpu002")
    [bad] = [c for c in gpu002.checks if c.verdict is Verdict.FAIL]
    assert bad.subject == "/tmp"


def test_a_missing_mount_point_fails_at_quick_and_the_node_check_level(
    cluster_yml: Path, tmp_path: Path
) -> None:
    sim = Sim({"gpu002": {"df": {"/tmp": ""}}})
    res = validate(
        load_cluster(cluster_yml), level="quick", out=tmp_path / "b", connector=FakeConnector(sim)
    )
    assert res.failed_nodes == ["gpu002"]


# ------------------------------------------------------------------------------------------
# The clock

DATE = capture_output(FIX / "node/date-epoch-ns-debian13-lab-node.txt")  # 1796347663.305881209
EPOCH = 1796347663.305881209


def _clock(cluster_yml: Path, ran: tuple[float, float] | None, text: str = DATE) -> CheckResult:
    from gpuctl.validation.judges.node import judge_clock

    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    [result] = judge_clock(exp, {"clock": ProbeOutput("clock", text, ran=ran)})
    return result


def test_a_clock_within_a_second_of_gpuctls_passes(cluster_yml: Path) -> None:
    ok = _clock(cluster_yml, (EPOCH - 0.3, EPOCH + 0.1))  # the node 0.1 s ahead, +/- 0.2
    assert ok.verdict is Verdict.OK
    assert (
        ok.message == "clock +0.100 s from gpuctl's (+/- 0.200 s, half the round trip), within 1 s"
    )
    assert (ok.measured, ok.expected, ok.unit) == (0.1, 1.0, "s")


def test_a_clock_off_by_more_than_the_limit_beyond_the_round_trip_fails(cluster_yml: Path) -> None:
    behind = _clock(cluster_yml, (EPOCH + 30.0, EPOCH + 30.2))  # 30.1 s behind
    assert behind.verdict is Verdict.FAIL
    assert behind.message.startswith("clock -30.100 s from gpuctl's (+/- 0.100 s")
    assert "more than 1 s off" in behind.message


def test_a_round_trip_too_slow_to_tell_is_unknown(cluster_yml: Path) -> None:
    # 0.9 s off, but the answer took 1 s: the node's time may be 1.4 s off or 0.4 s
    slow = _clock(cluster_yml, (EPOCH - 1.4, EPOCH - 0.4))
    assert slow.verdict is Verdict.UNKNOWN
    assert "too slow to tell" in slow.message


def test_no_recorded_window_or_no_gnu_date_is_unknown(cluster_yml: Path) -> None:
    assert _clock(cluster_yml, None).verdict is Verdict.UNKNOWN
    busybox = _clock(cluster_yml, (EPOCH, EPOCH), text="1796347663.N\n")
    assert busybox.verdict is Verdict.UNKNOWN
    assert "output not recognised" in busybox.message


def test_the_collector_records_when_each_probe_ran(cluster_yml: Path, tmp_path: Path) -> None:
    """meta.json keeps sent_at and received_at of every probe; a forged window (received before
    sent, before 2020, not a number) is not believed: UNKNOWN, never OK."""
    import json
    import time

    from gpuctl.validation.api import judge_bundle

    before = time.time()
    res = validate(
        load_cluster(cluster_yml),
        level="standard",
        out=tmp_path / "b",
        connector=FakeConnector(Sim()),
    )
    assert not res.failed
    meta = json.loads((res.bundle / "gpu001" / "meta.json").read_text())
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    for kind in (p.kind for p in probes_for(exp, "standard")):  # its own probes (not the pairs)
        info = meta["probes"][kind]
        assert before <= info["sent_at"] <= info["received_at"] <= time.time(), kind
    clock = meta["probes"]["clock"]
    for forged in ({"sent_at": clock["received_at"] + 1}, {"sent_at": 1.0}, {"sent_at": "x"}):
        meta["probes"]["clock"] = {**clock, **forged}
        (res.bundle / "gpu001" / "meta.json").write_text(json.dumps(meta))
        report = judge_bundle(load_cluster(cluster_yml), res.bundle)
        gpu001 = next(n for n in report.report.nodes if n.node == "gpu001")
        [found] = [c for c in gpu001.checks if c.check == "node.clock"]
        assert found.verdict is Verdict.UNKNOWN, forged


def test_a_node_whose_clock_is_off_fails_alone(cluster_yml: Path, tmp_path: Path) -> None:
    fails_only(cluster_yml, tmp_path / "b", {"clock_offset": 90.0}, "node.clock", "standard")


# ------------------------------------------------------------------------------------------
# Hugepages

MEMINFO = capture_output(FIX / "node/proc-meminfo-debian12-no-hugepages.txt")  # none, 2048 kB


def _reserved(total: int, size: int = 2048) -> str:
    import re

    text = re.sub(r"^HugePages_Total:\s+0$", f"HugePages_Total:    {total}", MEMINFO, flags=re.M)
    return re.sub(r"^Hugepagesize:\s+2048 kB$", f"Hugepagesize:    {size} kB", text, flags=re.M)


def _hugepages(cluster_yml: Path, want: dict[str, int] | None, text: str) -> list[CheckResult]:
    from gpuctl.validation.judges.node import judge_hugepages

    def edit(doc: dict[str, Any]) -> None:
        doc["node_groups"][1]["validation"]["hugepages"] = want

    exp = expectations(_cluster(cluster_yml, edit))["gpu001"]
    return judge_hugepages(exp, {"meminfo": ProbeOutput("meminfo", text)})


def test_the_pool_asked_for_passes_and_a_smaller_or_other_one_fails(cluster_yml: Path) -> None:
    [ok] = _hugepages(cluster_yml, {"size_kib": 2048, "min_total": 1024}, _reserved(1024))
    assert (ok.verdict, ok.message) == (
        Verdict.OK,
        "1024 hugepages of 2048 kB reserved, 0 free, at least 1024 wanted",
    )
    [few] = _hugepages(cluster_yml, {"size_kib": 2048, "min_total": 1024}, MEMINFO)
    assert (few.verdict, few.message) == (
        Verdict.FAIL,
        "0 hugepages of 2048 kB reserved, at least 1024 wanted",
    )
    [other] = _hugepages(cluster_yml, {"size_kib": 1048576, "min_total": 8}, _reserved(16))
    assert other.verdict is Verdict.FAIL
    assert (
        other.message == "default hugepage size 2048 kB, cluster.yml wants 1048576 kB (16 reserved)"
    )


def test_meminfo_without_the_pool_or_that_is_not_meminfo_is_unknown(cluster_yml: Path) -> None:
    want = {"size_kib": 2048, "min_total": 1}
    cut = "\n".join(line for line in MEMINFO.splitlines() if "Huge" not in line)
    [missing] = _hugepages(cluster_yml, want, cut)
    assert missing.verdict is Verdict.UNKNOWN
    [other] = _hugepages(cluster_yml, want, LAB_DF)
    assert other.verdict is Verdict.UNKNOWN
    assert "no MemTotal line" in other.message


def test_meminfo_is_read_only_where_a_group_asks_for_hugepages(cluster_yml: Path) -> None:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    assert exp.hugepages is None
    assert not any(p.kind == "meminfo" for p in probes_for(exp, "standard"))

    def edit(doc: dict[str, Any]) -> None:
        doc["node_groups"][1]["validation"]["hugepages"] = {"min_total": 64}

    exp = expectations(_cluster(cluster_yml, edit))["gpu001"]
    assert exp.hugepages == (2048, 64)
    assert [p.command(exp) for p in probes_for(exp, "standard") if p.kind == "meminfo"] == [
        ("cat", "/proc/meminfo")
    ]
    assert not any(p.kind == "meminfo" for p in probes_for(exp, "quick"))
