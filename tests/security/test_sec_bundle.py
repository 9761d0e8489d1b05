"""Hostile bundles for `gpuctl validate --bundle DIR` (issue 14): a bundle someone else sent in
is read without following a link out of it, every selected node it lacks fails, metadata that
is missing or implausible is UNKNOWN (never trusted), and no content crashes the judging (exit
70) or stops the other nodes from being judged.

Bundles are collected from the lab's hardware simulator (the stand-ins lab nodes run) over a fake
transport, then changed by hand the way a crafted bundle would be."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from test_collect import df_text
from typer.testing import CliRunner

from gpuctl import fileio
from gpuctl.cli.app import app
from gpuctl.config import load_cluster
from gpuctl.lab.sim import fabric as sim_fabric
from gpuctl.lab.sim import faults as sim_faults
from gpuctl.lab.sim import kernel as sim_kernel
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.lab.sim import standin
from gpuctl.remote import ExecResult, Target
from gpuctl.validation import bundle, judges, multinode_bundle, scope, suite
from gpuctl.validation import multinode as mn
from gpuctl.validation.api import judge_bundle, validate
from gpuctl.validation.expect import expectations
from gpuctl.validation.results import CheckResult, Verdict

FIXTURES = ROOT / "tests" / "fixtures"
PROFILE: dict[str, Any] = json.loads(sim_profiles.profile_json("hgx-h100-ndr"))
SECRET = "root:$6$SECRETHASH$abcdef:19000:0:99999:7:::\n"  # noqa: S105 - a fake shadow line
BOOT = "Linux version 6.1.0-31-amd64 (debian-kernel@lists.debian.org) #1 SMP Debian 6.1.128-1"
runner = CliRunner()


# ------------------------------------------------------------------------------------------
# A healthy bundle from the simulator (quick level: nvidia-smi, journalctl, systemctl, ibstat)


class _Running:
    def __init__(self, stdout: str, rc: int = 0, stderr: str = "") -> None:
        self.result = ExecResult(stdout.encode(), stderr.encode(), rc)

    def wait_for(self, text: str, timeout: float) -> bool:
        return False

    def finish(self, timeout: float) -> ExecResult:
        return self.result


class _Session:
    def __init__(self, node: str, faults: dict[str, dict[str, Any]]) -> None:
        self.node = node
        self.faults = faults.get(node, {})

    def start(self, command: str) -> _Running:
        words = shlex.split(command)
        if words[:1] == ["timeout"]:
            words = words[4:]
        tool, args = words[0], words[1:]
        if tool == "journalctl":
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
            lines = [BOOT, *sim_kernel.kernel_log_lines(PROFILE, self.faults, self.node)]
            return _Running("".join(f"{stamp} {self.node} kernel: {ln}\n" for ln in lines))
        if tool == "systemctl":
            text, rc = sim_fabric.systemctl_status(PROFILE, self.faults, self.node)
            return _Running(text, rc)
        if tool == "uname":  # a real tool on lab nodes, not a stand-in
            return _Running("6.1.0-31-amd64\n")
        if tool == "date":  # a real tool on lab nodes: the node's clock
            return _Running(f"{time.time():.9f}\n")
        if tool == "df":  # a real tool on lab nodes: rows of a real lab node's df
            return _Running(*df_text(args[args.index("--") + 1 :], {}))
        handler = standin._HANDLERS.get(tool)
        if handler is None:
            return _Running("", 127, f"sh: 1: {tool}: not found\n")
        out, err = io.StringIO(), io.StringIO()
        rc = handler(PROFILE, self.faults, self.node, args, standin._Out(out, err))
        return _Running(out.getvalue(), rc, err.getvalue())

    def close(self) -> None:
        pass


class _Connector:
    def __init__(self, faults: dict[str, dict[str, Any]] | None = None) -> None:
        self.faults = faults or {}

    def connect(self, target: Target) -> _Session:
        return _Session(target.node, self.faults)

    def close(self) -> None:
        pass


# GPU nodes in the lab cluster's cluster_yml fixture (tests/conftest.py)
LAB_NODES = 2


def _collect(cluster_yml: Path, name: str, faults: dict[str, dict[str, Any]] | None = None) -> Path:
    out = cluster_yml.parent / name
    validate(load_cluster(cluster_yml), level="quick", out=out, connector=_Connector(faults))
    (out / "results.json").unlink()  # judged again from the outputs, not from this
    return out


@pytest.fixture
def healthy(cluster_yml: Path) -> Path:
    return _collect(cluster_yml, "healthy")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the bundle that must never be read (a stand-in for /etc/shadow)."""
    path = tmp_path / "shadow"
    path.write_text(SECRET, encoding="utf-8")
    return path


def _validate(cluster_yml: Path, bundle: Path, *more: str) -> Any:
    return runner.invoke(
        app, ["validate", str(cluster_yml), "--bundle", str(bundle), "--json", *more]
    )


def _checks(stdout: str, node: str) -> list[dict[str, Any]]:
    data = json.loads(stdout)
    [entry] = [n for n in data["nodes"] if n["node"] == node]
    checks: list[dict[str, Any]] = entry["checks"]
    return checks


def _node(stdout: str, node: str) -> dict[str, Any]:
    data = json.loads(stdout)
    [entry] = [n for n in data["nodes"] if n["node"] == node]
    return dict(entry)


def _header(bundle: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    return data


def _set_header(bundle: Path, **fields: Any) -> None:
    header = _header(bundle)
    for key, value in fields.items():
        if value is _DROP:
            header.pop(key, None)
        else:
            header[key] = value
    (bundle / "bundle.json").write_text(json.dumps(header), encoding="utf-8")


_DROP = object()


def test_the_healthy_bundle_passes(cluster_yml: Path, healthy: Path) -> None:
    """The baseline every other test changes one thing of."""
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 0, res.output
    assert "3 nodes: 0 failed, 0 unreachable" in res.stderr


# ------------------------------------------------------------------------------------------
# 1. Links and other files that are not regular files inside the bundle are never read


def test_an_output_linked_to_a_secret_is_not_read_and_is_unknown(
    cluster_yml: Path, healthy: Path, secret: Path, tmp_path: Path
) -> None:
    for name in ("topo.txt", "nvlink.txt", "smi-xml.txt"):  # parsers quote a first line
        target = healthy / "gpu001" / name
        target.unlink()
        target.symlink_to(secret)
    html = tmp_path / "r.html"
    res = _validate(cluster_yml, healthy, "--html", str(html))
    assert res.exit_code == 1, res.output
    for text in (res.stdout, res.stderr, html.read_text(encoding="utf-8")):
        assert "SECRETHASH" not in text
        assert "root:" not in text
    refused = [c for c in _checks(res.stdout, "gpu001") if "symlink" in c["message"]]
    assert refused
    assert {c["verdict"] for c in refused} == {"unknown"}
    assert all("not read" in c["message"] for c in refused)
    assert not _node(res.stdout, "gpu002")["failed"]


def test_a_node_folder_linked_out_of_the_bundle_is_not_read(
    cluster_yml: Path, healthy: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(healthy / "gpu002"), elsewhere)  # a healthy folder, outside the bundle
    (healthy / "gpu002").symlink_to(elsewhere, target_is_directory=True)
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    [check] = _checks(res.stdout, "gpu002")
    assert (check["check"], check["verdict"]) == ("node.bundle", "unknown")
    assert "symlink" in check["message"]
    assert "not read" in check["message"]
    assert not _node(res.stdout, "gpu001")["failed"]


def test_a_linked_meta_json_is_not_read(cluster_yml: Path, healthy: Path, tmp_path: Path) -> None:
    real = tmp_path / "meta.json"
    shutil.move(str(healthy / "gpu001" / "meta.json"), real)
    (healthy / "gpu001" / "meta.json").symlink_to(real)
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    [check] = _checks(res.stdout, "gpu001")
    assert (check["check"], check["verdict"]) == ("node.bundle", "unknown")
    assert "meta.json" in check["message"]
    assert "symlink" in check["message"]


def test_a_fifo_as_an_output_is_refused_without_blocking(cluster_yml: Path, healthy: Path) -> None:
    target = healthy / "gpu001" / "topo.txt"
    target.unlink()
    os.mkfifo(target)
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    refused = [c for c in _checks(res.stdout, "gpu001") if "not a regular file" in c["message"]]
    assert refused
    assert {c["verdict"] for c in refused} == {"unknown"}


def test_a_linked_bundle_header_is_one_clear_line_exit_2(
    cluster_yml: Path, healthy: Path, tmp_path: Path
) -> None:
    real = tmp_path / "bundle.json"
    shutil.move(str(healthy / "bundle.json"), real)
    (healthy / "bundle.json").symlink_to(real)
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 2, res.output
    assert "bundle.json" in res.stderr
    assert "symlink" in res.stderr
    assert "Traceback" not in res.output


def _multinode_bundle(cluster_yml: Path, healthy: Path, runs: list[dict[str, Any]]) -> Path:
    folder = healthy / "_multinode" / "gpu"
    folder.mkdir(parents=True)
    meta = {"nodes": ["gpu001", "gpu002"], "excluded": {}, "runs": runs, "threshold": 100.0}
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def test_a_multinode_run_file_outside_its_folder_is_not_read(
    cluster_yml: Path, healthy: Path, tmp_path: Path
) -> None:
    # what the path points at is a passing nccl-tests output: read, it would clear both nodes
    good = FIXTURES / "nccl-tests" / "all-reduce-perf-2node-p5-h100-srun-prefix-table-only.txt"
    (tmp_path / "run.txt").write_bytes(good.read_bytes())
    nodes = ["gpu001", "gpu002"]
    folder = _multinode_bundle(
        cluster_yml, healthy, [{"nodes": nodes, "file": "../../../run.txt", "rc": 0}]
    )
    exps = expectations(load_cluster(cluster_yml))
    results, _ = multinode_bundle.judge_bundle_dir(healthy, exps)
    assert {(r.node, r.verdict) for r in results} == {(n, Verdict.UNKNOWN) for n in nodes}
    assert all(r.measured is None for r in results)
    # the same through a link inside the folder
    (folder / "run-01.txt").symlink_to(tmp_path / "run.txt")
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    meta["runs"][0]["file"] = "run-01.txt"
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    results, _ = multinode_bundle.judge_bundle_dir(healthy, exps)
    assert {(r.node, r.verdict) for r in results} == {(n, Verdict.UNKNOWN) for n in nodes}
    assert "symlink" in results[0].message


def test_a_linked_multinode_meta_is_unknown_for_its_group(
    cluster_yml: Path, healthy: Path, tmp_path: Path
) -> None:
    folder = _multinode_bundle(cluster_yml, healthy, [])
    shutil.move(str(folder / "meta.json"), tmp_path / "mn.json")
    (folder / "meta.json").symlink_to(tmp_path / "mn.json")
    results, _ = multinode_bundle.judge_bundle_dir(healthy, expectations(load_cluster(cluster_yml)))
    assert {(r.node, r.verdict) for r in results} == {
        ("gpu001", Verdict.UNKNOWN),
        ("gpu002", Verdict.UNKNOWN),
    }
    assert "symlink" in results[0].message


# ------------------------------------------------------------------------------------------
# 2. Every selected node of cluster.yml that the bundle lacks fails


def test_a_bundle_without_nodes_fails_every_node(cluster_yml: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    header = {"collected_at": "2025-03-14T10:15:00Z", "level": "quick", "nodes": []}
    (empty / "bundle.json").write_text(json.dumps({**header, "complete": True}))
    res = _validate(cluster_yml, empty)
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert [n["node"] for n in data["nodes"]] == ["ctl01", "gpu001", "gpu002"]
    for entry in data["nodes"]:
        assert entry["failed"]
        [check] = entry["checks"]
        assert (check["check"], check["verdict"]) == ("node.reachable", "fail")
        assert check["message"] == "not checked: missing from the bundle"
    assert "3 nodes: 3 failed" in res.stderr


def test_node_folders_the_cluster_does_not_know_are_ignored_not_passed(
    cluster_yml: Path, healthy: Path
) -> None:
    for node in ("ctl01", "gpu001", "gpu002"):
        shutil.move(str(healthy / node), healthy / f"evil-{node}")
    _set_header(healthy, nodes=["evil-ctl01", "evil-gpu001", "evil-gpu002"])
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert [n["node"] for n in data["nodes"]] == ["ctl01", "gpu001", "gpu002"]
    assert all(n["failed"] for n in data["nodes"])
    assert "evil" not in res.stdout
    assert "warning: the bundle holds folders of nodes that cluster.yml does not know" in (
        " ".join(res.stderr.split())
    )
    got = judge_bundle(load_cluster(cluster_yml), healthy)
    assert got.ignored == ("evil-ctl01", "evil-gpu001", "evil-gpu002")
    assert got.warnings == (
        "the bundle holds folders of nodes that cluster.yml does not know, not judged: "
        "evil-ctl01, evil-gpu001, evil-gpu002",
    )


def test_a_selected_node_the_bundle_lacks_fails_with_limit(
    cluster_yml: Path, healthy: Path
) -> None:
    shutil.rmtree(healthy / "gpu002")
    _set_header(healthy, nodes=["ctl01", "gpu001"])
    res = _validate(cluster_yml, healthy, "--limit", "gpu002")
    assert res.exit_code == 1, res.output
    [check] = _checks(res.stdout, "gpu002")
    assert check["message"] == "not checked: missing from the bundle"
    res = _validate(cluster_yml, healthy)  # no --limit: every node of cluster.yml
    assert res.exit_code == 1, res.output
    assert _node(res.stdout, "gpu002")["failed"]
    assert not _node(res.stdout, "gpu001")["failed"]
    res = _validate(cluster_yml, healthy, "--limit", "gpu001")
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------------------------------
# 3. Missing or implausible metadata is UNKNOWN for the checks that depend on it


def test_a_collection_time_in_the_future_does_not_hide_xid_events(cluster_yml: Path) -> None:
    bundle = _collect(cluster_yml, "xid", {"gpu001": dict(sim_faults.apply({}, "xid", "48:2"))})
    res = _validate(cluster_yml, bundle)
    assert res.exit_code == 1  # as collected: Xid 48 fails gpu001
    _set_header(bundle, collected_at="2099-01-01T00:00:00Z")
    res = _validate(cluster_yml, bundle)
    assert res.exit_code == 1, res.output
    checks = _checks(res.stdout, "gpu001")
    assert ("xid", "fail") in {(c["check"], c["verdict"]) for c in checks}
    [window] = [c for c in checks if c["check"] == "xid.window"]
    assert window["verdict"] == "unknown"
    assert "in the future" in window["message"]


@pytest.mark.parametrize(
    ("stamp", "said"),
    [
        (_DROP, "does not say when"),
        ("yesterday", "not an ISO 8601 time"),
        ("2025-03-14T10:15:00", "no time zone"),
        (datetime.now(UTC) + timedelta(hours=1), "in the future"),
        ("1970-01-01T00:00:00Z", "not a plausible collection time"),
        (1741947300, "not a time stamp"),
        (None, "does not say when"),
    ],
)
def test_an_implausible_collection_time_is_unknown_never_trusted(
    cluster_yml: Path, healthy: Path, stamp: Any, said: str
) -> None:
    value = stamp.strftime("%Y-%m-%dT%H:%M:%SZ") if isinstance(stamp, datetime) else stamp
    _set_header(healthy, collected_at=value)
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    for node in ("gpu001", "gpu002"):
        [window] = [c for c in _checks(res.stdout, node) if c["check"] == "xid.window"]
        assert window["verdict"] == "unknown"
        assert said in window["message"]
    assert not _node(res.stdout, "ctl01")["failed"]  # no GPU: no Xid window to place
    assert json.loads(res.stdout)["generated_at"] is None


def test_a_bundle_without_a_header_has_no_trusted_collection_time(
    cluster_yml: Path, healthy: Path
) -> None:
    (healthy / "bundle.json").unlink()
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    [window] = [c for c in _checks(res.stdout, "gpu001") if c["check"] == "xid.window"]
    assert "no bundle.json" in window["message"]


def test_a_missing_meta_json_is_unknown_not_exit_0(cluster_yml: Path, healthy: Path) -> None:
    (healthy / "gpu001" / "meta.json").unlink()
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    [check] = _checks(res.stdout, "gpu001")
    assert (check["check"], check["verdict"]) == ("node.bundle", "unknown")
    assert check["message"] == (
        "not judged: gpu001/meta.json is missing: how its probes ended is not recorded"
    )
    assert not _node(res.stdout, "gpu002")["failed"]


# ------------------------------------------------------------------------------------------
# 4. No content crashes the judging (exit 70)


@pytest.mark.parametrize(
    ("meta", "said"),
    [
        ("[]", "not a JSON object"),
        ("null", "not a JSON object"),
        ('"all good"', "not a JSON object"),
        ("[" * 10_000 + "]" * 10_000, "nested too deep"),
        ('{"probes": ', "not JSON"),
        (b'{"probes": {"smi-xml": {"error": "\xff"}}}', "not UTF-8"),
        ('{"probes": []}', "probes is not an object"),
    ],
)
def test_a_meta_json_of_the_wrong_shape_is_unknown_for_that_node(
    cluster_yml: Path, healthy: Path, meta: str | bytes, said: str
) -> None:
    path = healthy / "gpu001" / "meta.json"
    path.write_bytes(meta if isinstance(meta, bytes) else meta.encode())
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    [check] = _checks(res.stdout, "gpu001")
    assert (check["check"], check["verdict"]) == ("node.bundle", "unknown")
    assert said in check["message"]
    assert not _node(res.stdout, "gpu002")["failed"]


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("rc 0", "probes.smi-xml is not an object"),
        ({"rc": "0"}, "probes.smi-xml.rc is not an exit status"),
        ({"rc": True}, "probes.smi-xml.rc is not an exit status"),
        ({"rc": 0, "timed_out": "no"}, "probes.smi-xml.timed_out is not true or false"),
        ({"rc": 0, "error": ["x"]}, "probes.smi-xml.error is not a string"),
    ],
)
def test_a_probe_entry_of_the_wrong_shape_is_unknown_for_that_probe(
    cluster_yml: Path, healthy: Path, entry: Any, said: str
) -> None:
    path = healthy / "gpu001" / "meta.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta["probes"]["smi-xml"] = entry
    path.write_text(json.dumps(meta), encoding="utf-8")
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    flagged = [c for c in _checks(res.stdout, "gpu001") if said in c["message"]]
    assert flagged
    assert {c["verdict"] for c in flagged} == {"unknown"}


@pytest.mark.parametrize(
    ("header", "said"),
    [
        ("[]", "not a JSON object"),
        ("null", "not a JSON object"),
        ('"x"', "not a JSON object"),
        ("[" * 10_000 + "]" * 10_000, "nested too deep"),
        ("{", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        ('{"level": "turbo"}', "level"),
        ('{"level": 3}', "level"),
    ],
)
def test_an_unreadable_bundle_header_is_exit_2_with_one_line(
    cluster_yml: Path, healthy: Path, header: str | bytes, said: str
) -> None:
    (healthy / "bundle.json").write_bytes(header if isinstance(header, bytes) else header.encode())
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "bundle.json" in lines[0]
    assert said in lines[0]


@pytest.mark.parametrize("pairs", [5, "x", [1, None, {"server": "gpu001"}]])
def test_odd_header_fields_do_not_crash(cluster_yml: Path, healthy: Path, pairs: Any) -> None:
    _set_header(healthy, pairs=pairs, complete="yes", unreachable=7, nodes="gpu001")
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 0, res.output
    assert "did not finish" in res.stderr  # "complete" that is not true is not trusted


@pytest.mark.parametrize(
    "meta",
    [
        [],
        None,
        "x",
        {"nodes": "gpu001"},
        {"nodes": ["gpu001", "gpu002"], "excluded": ["gpu001"]},
        {"nodes": [], "excluded": {"gpu001": {"verdict": "bogus", "message": "x"}, "gpu002": 1}},
        {"nodes": ["gpu001", "gpu002"], "runs": "x"},
        {"nodes": ["gpu001", "gpu002"], "runs": [{"nodes": "gpu001", "file": 5, "rc": "x"}]},
        {"nodes": ["gpu001", "gpu002"], "runs": [{"nodes": ["gpu001", "gpu002"], "error": [1]}]},
        {"nodes": ["gpu001", "gpu002"], "max_runs": "many", "error": {"a": 1}},
    ],
)
def test_a_multinode_meta_of_the_wrong_shape_is_unknown_never_a_crash(
    cluster_yml: Path, healthy: Path, meta: Any
) -> None:
    folder = healthy / "_multinode" / "gpu"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    for node in ("gpu001", "gpu002"):
        verdicts = {c["verdict"] for c in _checks(res.stdout, node) if c["check"] == mn.CHECK}
        assert verdicts == {"unknown"}, (node, _checks(res.stdout, node))


def test_an_excluded_entry_cannot_pass_a_node(cluster_yml: Path, healthy: Path) -> None:
    folder = healthy / "_multinode" / "gpu"
    folder.mkdir(parents=True)
    ok = {"verdict": "ok", "message": "fine"}
    meta = {"nodes": [], "excluded": {"gpu001": ok, "gpu002": ok}}
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    results, _ = multinode_bundle.judge_bundle_dir(healthy, expectations(load_cluster(cluster_yml)))
    assert {(r.node, r.verdict) for r in results} == {
        ("gpu001", Verdict.UNKNOWN),
        ("gpu002", Verdict.UNKNOWN),
    }


# ------------------------------------------------------------------------------------------
# 5. One node's bad output never stops the others from being judged


def _boom_on_gpu002(exp: Any, outputs: Any) -> list[CheckResult]:
    if exp.node == "gpu002":
        raise RuntimeError("boom on gpu002")
    return []


def test_a_judge_that_raises_fails_that_node_only(
    cluster_yml: Path, healthy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(suite, "NODE_JUDGES", (*judges.NODE_JUDGES, _boom_on_gpu002))
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    [check] = _checks(res.stdout, "gpu002")
    assert (check["check"], check["verdict"]) == ("node.judged", "fail")
    assert check["message"] == "could not be judged: RuntimeError: boom on gpu002"
    assert not _node(res.stdout, "gpu001")["failed"]
    assert not _node(res.stdout, "ctl01")["failed"]


def test_a_judge_that_raises_in_a_worker_process_fails_that_node_only(
    cluster_yml: Path, healthy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(suite, "NODE_JUDGES", (*judges.NODE_JUDGES, _boom_on_gpu002))
    monkeypatch.setattr(suite, "POOL_MIN_NODES", 1)  # worker processes for three nodes
    cluster = scope.with_level(load_cluster(cluster_yml), "quick")
    report = suite.judge_cluster(cluster, healthy, jobs=2)
    by = {n.node: n for n in report.nodes}
    assert [(c.check, c.verdict) for c in by["gpu002"].checks] == [("node.judged", Verdict.FAIL)]
    assert not by["gpu001"].failed
    assert len(by["gpu001"].checks) > 5


def test_a_multinode_group_that_raises_leaves_the_nodes_judged(
    cluster_yml: Path, healthy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _multinode_bundle(cluster_yml, healthy, [])

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("threshold")

    monkeypatch.setattr(multinode_bundle, "judge_group", boom)
    res = _validate(cluster_yml, healthy)
    assert res.exit_code == 1, res.output
    for node in ("gpu001", "gpu002"):
        [check] = [c for c in _checks(res.stdout, node) if c["check"] == mn.CHECK]
        assert check["verdict"] == "fail"
        assert check["message"] == "could not be judged: KeyError: 'threshold'"
        assert len(_checks(res.stdout, node)) > 5


# ------------------------------------------------------------------------------------------
# 6. The one atomic writer


def test_the_bundle_is_written_through_the_shared_atomic_writer(
    cluster_yml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert bundle.write_atomic is fileio.write_atomic
    written: list[tuple[str, int, bool]] = []
    real = fileio.write_atomic

    def spy(path: Path, data: bytes | str, *, mode: int = 0o644, durable: bool = False,
            dir_mode: int | None = None) -> None:  # fmt: skip
        written.append((path.name, mode, durable))
        real(path, data, mode=mode, durable=durable, dir_mode=dir_mode)

    monkeypatch.setattr(bundle, "write_atomic", spy)
    out = cluster_yml.parent / "b"
    validate(
        load_cluster(cluster_yml), level="quick", limit="gpu001", out=out, connector=_Connector()
    )
    names = {name for name, _, _ in written}
    assert {"bundle.json", "meta.json", "smi-xml.txt", "results.json"} <= names
    assert {(mode, durable) for _, mode, durable in written} == {(0o644, False)}
    assert oct((out / "gpu001" / "meta.json").stat().st_mode & 0o777) == oct(0o644)
