"""Hostile cluster.yml: no value may run code, write a line the model did not intend, escape
the render folder or make gpuctl read or expand without bound (issue 14)."""

from __future__ import annotations

import json
import os
import resource
import shlex
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT

from gpuctl.config.loader import load_cluster, load_cluster_text
from gpuctl.config.model import Cluster
from gpuctl.errors import ConfigError
from gpuctl.render import MANIFEST, render_cluster, render_files

EXAMPLE = ROOT / "inventories" / "hgx-h100-ndr.yml"


def _base() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    return doc


def _load(doc: dict[str, Any]) -> Cluster:
    """Through YAML text, as a file would be read (problems carry their paths)."""
    text = yaml.safe_dump(doc, allow_unicode=True, default_style='"')  # lossless: escapes
    return load_cluster_text(text, "cluster.yml")


def _problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(doc)
    return [str(p) for p in info.value.problems]


# ------------------------------------------------------------------------------------------
# Code execution through ssh.jump_host's ProxyCommand


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("host", "x$(touch /tmp/gpuctl-pwned)"),
        ("host", "bastion;id"),
        ("host", "bastion example.com"),
        ("host", "-oProxyCommand=id"),
        ("user", "ops$(id)"),
        ("user", "-oProxyCommand=id"),
        ("user", "o ps"),
    ],
)
def test_jump_host_and_user_must_be_a_host_name_and_a_login_name(field: str, value: str) -> None:
    doc = _base()
    doc["ssh"]["jump_host"][field] = value
    problems = _problems(doc)
    assert any(f"ssh.jump_host.{field}" in p for p in problems), problems


# ------------------------------------------------------------------------------------------
# RDMA device names become command arguments and the names of the bundle's output files


@pytest.mark.parametrize(
    "value", ["../../../../tmp/gpuctl-pwned", "a/b", "mlx5_0:1", "mlx5_0;id", "-x", ".hidden"]
)
def test_device_names_must_be_rdma_device_names(value: str) -> None:
    doc = _base()
    doc["node_groups"][2]["nics"][0]["devices"] = value
    doc["node_groups"][2]["nics"][0]["rails"] = False
    problems = _problems(doc)
    assert any(
        "node_groups[2].nics[0].devices" in p and "not an RDMA device name" in p for p in problems
    ), problems


def test_a_kind_that_is_a_path_is_never_written(tmp_path: Path) -> None:
    """The bundle writer's own guard, below the config's: nothing outside the node folder."""
    from gpuctl.remote import ExecResult
    from gpuctl.validation.bundle import NodeFolder

    folder = NodeFolder(tmp_path / "bundle" / "gpu001")
    for kind in ("perfquery.start.../../../escaped", "../escaped", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="not a probe kind"):
            folder.record(kind, ExecResult(stdout=b"x", rc=0), ("true",), 1)
    assert not list(tmp_path.rglob("*escaped*"))
    assert not (tmp_path / "bundle").exists() or not any((tmp_path / "bundle").rglob("*.txt"))
    folder.record("perfquery.start.mlx4_0:2", ExecResult(stdout=b"x", rc=0), ("true",), 1)
    assert (tmp_path / "bundle" / "gpu001" / "perfquery.start.mlx4_0:2.txt").read_bytes() == b"x"


@pytest.mark.parametrize("value", ["ops$(id)", "-l", "a b", "root\n"])
def test_ssh_user_must_be_a_login_name(value: str) -> None:
    doc = _base()
    doc["ssh"]["user"] = value
    assert any("ssh.user" in p for p in _problems(doc))


def _proxy_argv(tmp_path: Path, private_key: str) -> list[str]:
    """Run the rendered ProxyCommand the way ssh does (``/bin/sh -c``) after Ansible's
    shlex split of ansible_ssh_common_args, with ``ssh`` a stand-in that prints its argv."""
    doc = _base()
    doc["ssh"]["private_key"] = private_key
    files = render_files(_load(doc))
    inventory = yaml.safe_load(files["inventory.yml"])
    common = inventory["all"]["vars"]["ansible_ssh_common_args"]
    words = shlex.split(common)  # what Ansible hands to ssh
    proxy = next(w for w in words if w.startswith("ProxyCommand="))
    command = proxy.removeprefix("ProxyCommand=").replace("%h", "gpu001").replace("%p", "22")
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    stub = bindir / "ssh"
    stub.write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n",
        encoding="utf-8",
    )
    stub.chmod(0o755)
    out = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd=tmp_path,
    )
    argv: list[str] = json.loads(out.stdout)
    return argv


@pytest.mark.parametrize(
    "key",
    [
        "/keys/id_ed25519",
        "/keys/with space/id",
        "/keys/semi;colon",
        "/keys/$(touch pwned)",
        "/keys/`touch pwned`",
        "/keys/a'b",
    ],
)
def test_proxy_command_passes_the_key_path_as_one_word_and_runs_nothing(
    tmp_path: Path, key: str
) -> None:
    argv = _proxy_argv(tmp_path, key)
    assert argv[argv.index("-i") + 1] == key
    assert argv[-1] == "ops@bastion.example.com"
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------------------------
# Templates: no value becomes Jinja for Ansible

TEMPLATE = "{{ lookup('pipe', 'touch /tmp/gpuctl-pwned') }}"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("package_sources", "os_mirror"), f"http://mirror/{TEMPLATE}"),
        (("package_sources", "http_proxy"), "http://u:{{x}}@proxy:3128"),
        (("package_sources", "nccl_tests"), "https://git/{%raw%}x"),
        (("ssh", "private_key"), TEMPLATE),
        (("ssh", "known_hosts"), "kh{#x#}"),
        (("software", "mpi", "url"), f"http://x/{TEMPLATE}"),
        (("slurm", "extra", "SchedulerParameters"), TEMPLATE),
        (("bmc", "gpu_inventory_prefix"), "{{x}}"),
    ],
)
def test_template_markers_are_refused_at_load(path: tuple[str, ...], value: str) -> None:
    doc = _base()
    target = doc
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value
    problems = _problems(doc)
    assert any(".".join(path) in p and "template" in p for p in problems), problems


# ------------------------------------------------------------------------------------------
# No line in a rendered config file that the model did not intend


@pytest.mark.parametrize(
    "value",
    [
        "1\nAuthType=auth/none",
        "1\rAuthType=auth/none",
        "x\x00y",
        "x\x1b[31m",
        "x\u2028AuthType=auth/none",
        "x\x85AuthType=auth/none",
    ],
)
def test_control_characters_in_slurm_extra_are_refused(value: str) -> None:
    doc = _base()
    doc["slurm"]["extra"] = {"SchedulerParameters": value}
    problems = _problems(doc)
    assert any("slurm.extra.SchedulerParameters" in p for p in problems), problems


def test_control_characters_are_refused_in_every_string() -> None:
    doc = _base()
    doc["package_sources"]["os_mirror"] = "http://mirror/a\tb"
    doc["bmc"] = {"system_id": "Self\nx"}
    problems = _problems(doc)
    assert any("package_sources.os_mirror" in p for p in problems), problems
    assert any("bmc.system_id" in p for p in problems), problems


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "0%", "0.0%"])
def test_thresholds_that_judge_nothing_are_refused(value: Any) -> None:
    doc = _base()
    doc.setdefault("validation", {})["thresholds"] = {"ib_write_bw_gbps": value}
    assert any("ib_write_bw_gbps" in p for p in _problems(doc))


@pytest.mark.parametrize("key", ["nccl_all_reduce_busbw_gbs", "pcie_h2d_gbs"])
def test_infinite_float_thresholds_are_refused(key: str) -> None:
    doc = _base()
    doc.setdefault("validation", {})["thresholds"] = {key: float("inf")}
    assert any(key in p for p in _problems(doc))


# ------------------------------------------------------------------------------------------
# Writing outside the render folder; modes of what holds secrets


def test_render_removes_only_paths_inside_its_folder(tmp_path: Path) -> None:
    cluster = load_cluster(EXAMPLE)
    out = tmp_path / "out"
    render_cluster(cluster, out)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.yml").write_text("keep\n")
    (out / "linked").symlink_to(elsewhere)
    manifest = out / MANIFEST
    manifest.write_text(
        manifest.read_text() + f"{victim}\n../victim\nlinked/x.yml\n", encoding="utf-8"
    )
    render_cluster(cluster, out)
    assert victim.read_text() == "keep\n"
    assert (elsewhere / "x.yml").read_text() == "keep\n"


def test_rendered_files_are_private_to_the_operator(tmp_path: Path) -> None:
    doc = _base()
    doc["package_sources"]["http_proxy"] = "http://user:s3cret@proxy.example.com:3128"
    out = tmp_path / "out"
    render_cluster(_load(doc), out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for path in out.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path


# ------------------------------------------------------------------------------------------
# Bounded reading and expansion


def _memory_cap() -> None:  # pragma: no cover - runs in the child
    cap = 1536 * 1024**2  # gpuctl check needs far less; reading 2 GiB needs more
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _gpuctl_check(path: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
        preexec_fn=_memory_cap,
    )


def test_check_refuses_a_device_without_reading_it() -> None:
    started = time.monotonic()
    res = _gpuctl_check(Path("/dev/zero"))
    assert res.returncode == 2, res.stderr
    assert "not a regular file" in res.stderr
    assert time.monotonic() - started < 20


def test_check_refuses_a_huge_file_before_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "cluster.yml"
    with big.open("wb") as fh:
        fh.truncate(2 * 1024**3)  # sparse: 2 GiB that would all be read
    started = time.monotonic()
    res = _gpuctl_check(big)
    assert res.returncode == 2, res.stderr
    assert "larger than" in res.stderr
    assert time.monotonic() - started < 20


def test_millions_of_nodes_in_all_are_refused_with_one_line(tmp_path: Path) -> None:
    groups = "\n".join(
        textwrap.dedent(
            f"""\
              - name: g{i:02d}
                nodes: g{i:02d}n[000001-090000]
                roles: [compute]
            """
        )
        for i in range(30)
    )
    path = tmp_path / "cluster.yml"
    path.write_text(
        "name: big\nsoftware: {driver: {branch: '570', version: '570.133.20'}, cuda: '12.8', "
        "nccl: '2.26.2-1+cuda12.8', nccl_tests: '2.14.1', dcgm: '4.2.3'}\n"
        "slurm: {controller: g00n000001, partitions: [{name: p, node_groups: [g00]}]}\n"
        "node_groups:\n" + textwrap.indent(groups, "  "),
        encoding="utf-8",
    )
    started = time.monotonic()
    res = _gpuctl_check(path, timeout=60)
    took = time.monotonic() - started
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr[-2000:]
    assert "at most 100000 nodes" in errors[0]
    assert took < 10, took


def test_a_hundred_thousand_bad_node_names_give_a_bounded_number_of_messages() -> None:
    doc = _base()
    doc["node_groups"][2]["nodes"] = ",".join(f"bad_{i}" for i in range(99_000))
    problems = _problems(doc)
    assert len(problems) <= 101, len(problems)
    assert any("more" in p for p in problems[-3:]), problems[-3:]
