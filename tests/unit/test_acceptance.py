"""gpuctl acceptance: the runner (command, environment, run directory, JUnit, exit codes), the
plugin's SSH settings, the expectations, and the shipped suite failing closed on a machine where
nothing is installed (testinfra's Ansible backend with local connections: no SSH needed)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any, Literal

import jinja2
import pytest
import yaml
from helpers import ROOT
from typer.testing import CliRunner

from gpuctl.acceptance import expect
from gpuctl.acceptance.plugin import _host_key_checked, ssh_common_args
from gpuctl.acceptance.runner import (
    AcceptanceResult,
    AcceptanceRun,
    Status,
    TestOutcome,
    build_command,
    build_env,
    execute,
    host_of,
    judge,
    prepare,
)
from gpuctl.cli import acceptance_cmd
from gpuctl.cli.app import app
from gpuctl.config import load_cluster
from gpuctl.errors import ConfigError, EnvironmentProblem, UsageError
from gpuctl.provision.runner import state_dir_for
from gpuctl.render import render_cluster
from gpuctl.resources import playbooks_dir

LAB_EXAMPLE = ROOT / "inventories" / "lab.yml"
KNOWN_HOSTS_LINE = (
    "198.18.0.10 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh0ZXN0a2V5dGVzdGtleXRlc3RrZXl0ZXN0a2V5\n"
)


# ------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def cluster_yml(tmp_path: Path) -> Path:
    """The lab example cluster.yml with a known_hosts where it says (relative to it)."""
    path = tmp_path / "site" / "cluster.yml"
    path.parent.mkdir()
    shutil.copy(LAB_EXAMPLE, path)
    kh = path.parent / load_cluster(path).ssh.known_hosts
    kh.parent.mkdir(parents=True, exist_ok=True)
    kh.write_text(KNOWN_HOSTS_LINE, encoding="utf-8")
    return path


def _local_run(
    tmp_path: Path,
    hosts: dict[str, list[str]],
    test_dirs: list[Path],
    *,
    include_suite: bool = False,
    group_vars_from: Path | None = None,
    host_vars: dict[str, Any] | None = None,
    ansible_cfg: str | None = None,
) -> AcceptanceRun:
    """A run over an inventory of local-connection hosts (name -> groups)."""
    run_dir = tmp_path / "run"
    inv_dir = run_dir / "inventory"
    inv_dir.mkdir(parents=True)
    (run_dir / "tmp").mkdir()
    (run_dir / "pytest.ini").write_text("[pytest]\njunit_family = xunit2\n", encoding="utf-8")
    if group_vars_from is not None:
        shutil.copytree(group_vars_from / "group_vars", inv_dir / "group_vars")
        shutil.copytree(group_vars_from / "slurm", inv_dir / "slurm")
    groups: dict[str, dict[str, Any]] = {}
    for name, member_of in hosts.items():
        for group in member_of:
            groups.setdefault(group, {"hosts": {}})["hosts"][name] = None
    doc = {
        "all": {
            "hosts": {name: {"ansible_connection": "local", **(host_vars or {})} for name in hosts},
            "children": groups,
        }
    }
    inventory = inv_dir / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc), encoding="utf-8")
    if ansible_cfg is not None:
        (inv_dir / "ansible.cfg").write_text(ansible_cfg, encoding="utf-8")
    junit = tmp_path / "report" / "junit.xml"
    junit.parent.mkdir()
    argv = build_command(
        run_dir=run_dir,
        inventory=inventory,
        hosts=None,
        junit=junit,
        test_dirs=test_dirs,
        include_suite=include_suite,
    )
    return AcceptanceRun(
        run_dir,
        inventory,
        tuple(sorted(hosts)),
        junit,
        tuple(test_dirs),
        tuple(argv),
        build_env(inventory),
    )


def _tests(tmp_path: Path, name: str, body: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "test_site.py").write_text(body, encoding="utf-8")
    return folder


PASSING = """
def test_uname(node):
    assert node.run("uname").rc == 0

def test_host_fixture_too(host):
    assert host.run("true").rc == 0
"""

ONE_HOST_FAILS = """
def test_only_b_fails(node):
    assert node.name != "b", "b is broken"
"""


# ------------------------------------------------------------------------------------------
# command and environment


def test_command_runs_the_shipped_suite_on_all_hosts(tmp_path: Path) -> None:
    inv = tmp_path / "inventory" / "inventory.yml"
    junit = tmp_path / "out.xml"
    argv = build_command(run_dir=tmp_path, inventory=inv, hosts=None, junit=junit)
    assert argv[:3] == [sys.executable, "-m", "pytest"]
    assert argv[argv.index("-c") + 1] == str(tmp_path / "pytest.ini")
    assert argv[argv.index("--rootdir") + 1] == str(tmp_path)
    assert "--hosts=ansible://all" in argv
    assert f"--ansible-inventory={inv}" in argv
    assert f"--junitxml={junit}" in argv
    plugin = argv.index("gpuctl.acceptance.plugin")
    assert argv[plugin - 1] == "-p"
    assert argv[-2:] == ["--pyargs", "gpuctl.acceptance"]


def test_command_limits_hosts_and_adds_user_folders(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    argv = build_command(
        run_dir=tmp_path,
        inventory=tmp_path / "inventory.yml",
        hosts=["gpu001", "gpu002"],
        junit=tmp_path / "j.xml",
        test_dirs=[mine, theirs],
    )
    assert "--hosts=ansible://gpu001,ansible://gpu002" in argv
    assert argv[-4:] == ["--pyargs", "gpuctl.acceptance", str(mine), str(theirs)]
    without = build_command(
        run_dir=tmp_path,
        inventory=tmp_path / "inventory.yml",
        hosts=None,
        junit=tmp_path / "j.xml",
        test_dirs=[mine],
        include_suite=False,
    )
    assert "--pyargs" not in without
    assert without[-1] == str(mine)
    with pytest.raises(UsageError):
        build_command(run_dir=tmp_path, inventory=tmp_path, hosts=[], junit=tmp_path / "j")


def test_environment_drops_the_callers_ansible_settings(tmp_path: Path) -> None:
    inv = tmp_path / "inventory" / "inventory.yml"
    env = build_env(
        inv,
        {
            "PATH": "/usr/bin",
            "HOME": "/root",
            "ANSIBLE_SSH_COMMON_ARGS": "-o StrictHostKeyChecking=no",
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_SSH_EXTRA_ARGS": "-o UserKnownHostsFile=/dev/null",
        },
    )
    assert "ANSIBLE_SSH_COMMON_ARGS" not in env
    assert "ANSIBLE_SSH_EXTRA_ARGS" not in env
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert env["ANSIBLE_CONFIG"] == str(inv.parent / "ansible.cfg")
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["HOME"] == "/root"


# ------------------------------------------------------------------------------------------
# run directory


def test_prepare_renders_into_a_run_directory(cluster_yml: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = prepare(load_cluster(cluster_yml), state_dir=state)
    assert run.run_dir.parent == state / "acceptance"
    assert run.run_dir.stat().st_mode & 0o777 == 0o700
    rendered = run.run_dir / "inventory"
    for name in ("inventory.yml", "ansible.cfg", "slurm/slurm.conf", "group_vars/all.yml"):
        assert (rendered / name).is_file(), name
    assert (rendered / "known_hosts").read_text(encoding="utf-8") == KNOWN_HOSTS_LINE
    assert (run.run_dir / "pytest.ini").is_file()
    assert run.hosts == ("ctl01", "gpu001", "gpu002")
    assert run.junit == run.run_dir / "junit.xml"
    assert "--hosts=ansible://all" in run.argv
    assert run.env["ANSIBLE_CONFIG"] == str(rendered / "ansible.cfg")


def test_prepare_default_state_dir_is_beside_cluster_yml(
    cluster_yml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUCTL_STATE_DIR", raising=False)
    run = prepare(load_cluster(cluster_yml), state_dir=state_dir_for(cluster_yml))
    assert run.run_dir.parent == cluster_yml.parent / ".gpuctl" / "acceptance"


@pytest.mark.parametrize(
    ("limit", "hosts"),
    [
        ("gpu[001-002]", ("gpu001", "gpu002")),
        ("gpu002", ("gpu002",)),
        ("role_controller", ("ctl01",)),
        ("all:!gpu001", ("ctl01", "gpu002")),
    ],
)
def test_prepare_limit(cluster_yml: Path, tmp_path: Path, limit: str, hosts: tuple[str]) -> None:
    run = prepare(load_cluster(cluster_yml), limit=limit, state_dir=tmp_path / "s")
    assert run.hosts == hosts
    assert f"--hosts={','.join('ansible://' + h for h in hosts)}" in run.argv


def test_prepare_limit_matching_nothing(cluster_yml: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="matches no host"):
        prepare(load_cluster(cluster_yml), limit="gpu999", state_dir=tmp_path / "s")


def test_prepare_refuses_missing_known_hosts(cluster_yml: Path, tmp_path: Path) -> None:
    (cluster_yml.parent / load_cluster(cluster_yml).ssh.known_hosts).unlink()
    with pytest.raises(EnvironmentProblem, match="known_hosts"):
        prepare(load_cluster(cluster_yml), state_dir=tmp_path / "s")


def test_prepare_user_folders_and_junit_path(cluster_yml: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a folder"):
        prepare(load_cluster(cluster_yml), test_dirs=[tmp_path / "nope"], state_dir=tmp_path / "s")
    with pytest.raises(UsageError, match="does not exist"):
        prepare(
            load_cluster(cluster_yml), junit=tmp_path / "no" / "j.xml", state_dir=tmp_path / "s"
        )
    mine = tmp_path / "mine"
    mine.mkdir()
    run = prepare(
        load_cluster(cluster_yml),
        test_dirs=[mine],
        junit=tmp_path / "r.xml",
        state_dir=tmp_path / "s",
    )
    assert run.test_dirs == (mine.resolve(),)
    assert run.argv[-1] == str(mine.resolve())
    assert run.junit == (tmp_path / "r.xml").resolve()


# ------------------------------------------------------------------------------------------
# pytest runs on local-connection hosts (testinfra's Ansible backend, no SSH)


def test_user_tests_pass_on_every_host(tmp_path: Path) -> None:
    mine = _tests(tmp_path, "mine", PASSING)
    run = _local_run(tmp_path, {"a": ["gpu"], "b": ["gpu"]}, [mine])
    lines: list[str] = []
    result = execute(run, lines.append)
    assert result.status == "passed", (result.message, "\n".join(lines))
    assert result.returncode == 0
    assert run.junit.is_file()
    assert result.counts() == {"passed": 4, "failed": 0, "error": 0, "skipped": 0}
    assert result.counts("a")["passed"] == result.counts("b")["passed"] == 2
    assert any("test_uname[ansible://a] PASSED" in ln for ln in lines)
    assert (run.run_dir / "pytest.log").read_text(encoding="utf-8").splitlines() == lines


def test_a_failure_is_attributed_to_its_host(tmp_path: Path) -> None:
    mine = _tests(tmp_path, "mine", ONE_HOST_FAILS)
    result = execute(_local_run(tmp_path, {"a": [], "b": []}, [mine]))
    assert result.status == "failed"
    assert [(t.host, t.outcome) for t in result.tests] == [("a", "passed"), ("b", "failed")]
    assert "b is broken" in result.tests[1].message


def test_two_user_folders_with_the_same_file_names(tmp_path: Path) -> None:
    one = _tests(tmp_path, "one", PASSING)
    two = _tests(tmp_path, "two", ONE_HOST_FAILS)
    result = execute(_local_run(tmp_path, {"a": [], "b": []}, [one, two]))
    assert result.status == "failed"
    assert result.counts() == {"passed": 5, "failed": 1, "error": 0, "skipped": 0}


def test_a_broken_test_file_is_an_error_not_a_pass(tmp_path: Path) -> None:
    mine = _tests(tmp_path, "mine", "def test_x(node:\n")
    result = execute(_local_run(tmp_path, {"a": []}, [mine]))
    assert result.status == "error"
    assert result.returncode == 2


def test_only_skips_is_an_error(tmp_path: Path) -> None:
    body = "import pytest\n\n@pytest.mark.applies_to('gpu')\ndef test_x(node):\n    pass\n"
    result = execute(_local_run(tmp_path, {"a": ["ctl"]}, [_tests(tmp_path, "mine", body)]))
    assert result.status == "error"
    assert result.counts()["skipped"] == 1
    assert "not applicable: a is not in group gpu" in result.tests[0].message


def test_no_tests_is_an_error(tmp_path: Path) -> None:
    result = execute(_local_run(tmp_path, {"a": []}, [_tests(tmp_path, "mine", "X = 1\n")]))
    assert (result.status, result.returncode) == ("error", 5)


def test_ssh_hosts_must_check_host_keys(tmp_path: Path) -> None:
    run = _local_run(
        tmp_path,
        {"a": []},
        [_tests(tmp_path, "mine", PASSING)],
        host_vars={
            "ansible_connection": "ssh",
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no",
        },
    )
    lines: list[str] = []
    result = execute(run, lines.append)
    assert result.status == "error"
    assert any("must check host keys" in ln for ln in lines), lines


def test_ansible_cfg_cannot_turn_host_key_checking_off(tmp_path: Path) -> None:
    """ssh takes an option's first value: ansible.cfg's ssh_args come before the inventory's."""
    run = _local_run(
        tmp_path,
        {"a": []},
        [_tests(tmp_path, "mine", PASSING)],
        host_vars={
            "ansible_connection": "ssh",
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes",
        },
        ansible_cfg="[ssh_connection]\nssh_args = -o StrictHostKeyChecking=no\n",
    )
    lines: list[str] = []
    assert execute(run, lines.append).status == "error"
    assert any("must check host keys" in ln for ln in lines), lines


def test_paramiko_is_refused(tmp_path: Path) -> None:
    run = _local_run(
        tmp_path,
        {"a": []},
        [_tests(tmp_path, "mine", PASSING)],
        host_vars={"ansible_connection": "paramiko"},
    )
    lines: list[str] = []
    assert execute(run, lines.append).status == "error"
    assert any("paramiko" in ln for ln in lines)


def test_shipped_suite_fails_closed_where_nothing_is_installed(tmp_path: Path) -> None:
    """This machine as a GPU compute node of the lab example: no driver, munge or Slurm here,
    so every applicable test fails; none passes and none is skipped as if it passed."""
    rendered = tmp_path / "rendered"
    render_cluster(load_cluster(LAB_EXAMPLE), rendered)
    groups = ["ng_gpu", "gpu", "nvswitch", "rdma", "role_compute", "fabric_ib"]
    run = _local_run(tmp_path, {"gpu001": groups}, [], include_suite=True, group_vars_from=rendered)
    lines: list[str] = []
    result = execute(run, lines.append)
    assert result.status == "failed", "\n".join(lines[-40:])
    by_name = {t.name.rsplit("::", 1)[-1].split("[")[0]: t for t in result.tests}
    assert [t.name for t in result.tests if t.outcome == "passed"] == []
    for t in result.tests:
        if t.outcome == "skipped":
            assert "not applicable:" in t.message, t
    for name in (
        "test_driver_packages_pinned_and_held",
        "test_driver_loaded_at_pinned_version",
        "test_device_nodes",
        "test_fabric_manager_at_driver_version",
        "test_nccl_tests_built",
        "test_dcgm_active",
        "test_rdma_devices_present",
        "test_validation_tools",
        "test_perftest_with_cuda",
        "test_munge_key_owner_and_mode",
        "test_slurmd_active",
        "test_slurm_node_state",
        "test_slurm_config_matches_render",
    ):
        assert by_name[name].outcome in ("failed", "error"), by_name[name]
    assert by_name["test_slurmctld_active"].outcome == "skipped"  # not a controller
    assert by_name["test_slurm_node_state"].host == "gpu001"


# ------------------------------------------------------------------------------------------
# judging and reading the report


def test_judge() -> None:
    ok = TestOutcome("t[ansible://a]", "a", "passed")
    bad = TestOutcome("t[ansible://b]", "b", "failed")
    skip = TestOutcome("s[ansible://b]", "b", "skipped")
    assert judge(0, [ok, skip], None) == ("passed", "")
    assert judge(0, [ok], "junit.xml was not written")[0] == "error"
    assert judge(0, [ok, bad], None)[0] == "failed"
    assert judge(0, [skip], None)[0] == "error"
    assert judge(1, [ok, bad], None) == ("failed", "")
    for rc in (2, 3, 4, 5, 70):
        assert judge(rc, [ok], None)[0] == "error"


def test_host_of() -> None:
    hosts = ["gpu001", "gpu-a", "gpu-a-01"]
    assert host_of("test_x[ansible://gpu001]", hosts) == "gpu001"
    assert host_of("test_x[ansible://gpu001-slurm.conf]", hosts) == "gpu001"
    assert host_of("test_x[ansible://gpu-a-01-gres.conf]", hosts) == "gpu-a-01"
    assert host_of("test_x[ansible://gpu-a]", hosts) == "gpu-a"
    assert host_of("test_x[local://]", hosts) is None
    assert host_of("test_x", hosts) is None


# ------------------------------------------------------------------------------------------
# the plugin's SSH settings


def test_ssh_common_args_fill_in_inventory_dir() -> None:
    args = "-o UserKnownHostsFile={{ inventory_dir }}/known_hosts -o StrictHostKeyChecking=yes"
    value = ssh_common_args({"a": {"ansible_ssh_common_args": args}}, Path("/r/inv"))
    assert value == "-o UserKnownHostsFile=/r/inv/known_hosts -o StrictHostKeyChecking=yes"
    assert _host_key_checked(value)
    with pytest.raises(pytest.UsageError, match="different"):
        ssh_common_args(
            {"a": {"ansible_ssh_common_args": args}, "b": {"ansible_ssh_common_args": "-4"}},
            Path("/r"),
        )
    with pytest.raises(pytest.UsageError, match="Jinja"):
        ssh_common_args({"a": {"ansible_ssh_common_args": "{{ other }}"}}, Path("/r"))
    with pytest.raises(pytest.UsageError, match="characters"):
        ssh_common_args({"a": {"ansible_ssh_common_args": args}}, Path("/r/with space"))


def test_host_key_checking_must_be_yes() -> None:
    assert not _host_key_checked("")
    assert not _host_key_checked("-o StrictHostKeyChecking=no")
    assert not _host_key_checked("-o StrictHostKeyChecking=accept-new")
    assert not _host_key_checked("-o StrictHostKeyChecking=yes -o StrictHostKeyChecking=no")
    rendered = (
        '-o StrictHostKeyChecking=yes -o ProxyCommand="ssh -W %h:%p -o StrictHostKeyChecking=yes'
        ' ops@bastion"'
    )
    assert _host_key_checked(rendered)


# ------------------------------------------------------------------------------------------
# expectations


def test_os_family() -> None:
    assert expect.os_family('ID=debian\nVERSION_ID="12"\n') == "Debian"
    assert expect.os_family("ID=ubuntu\nID_LIKE=debian\n") == "Ubuntu"
    assert expect.os_family('ID="rocky"\nID_LIKE="rhel centos fedora"\n') == "RedHat"
    assert expect.os_family('ID=ol\nID_LIKE="fedora rhel"\n') == "RedHat"
    with pytest.raises(ConfigError, match="not one the roles support"):
        expect.os_family('ID=arch\nPRETTY_NAME="Arch Linux"\n')


def test_version_matches() -> None:
    spec = expect.PackageSpec
    assert expect.version_matches("570.172.08-1", spec("x", "570.172.08-1"), "Debian")
    assert not expect.version_matches("570.172.08-2", spec("x", "570.172.08-1"), "Debian")
    assert expect.version_matches("1:4.4.1-1", spec("x", "1:4.4.1-1"), "Debian")
    assert not expect.version_matches("4.4.1-1", spec("x", "1:4.4.1-1"), "Debian")
    slurm = spec("slurmd", "22.05.8", upstream_only=True)
    assert expect.version_matches("22.05.8-4+deb12u3", slurm, "Debian")
    assert not expect.version_matches("22.05.80-1", slurm, "Debian")
    assert expect.version_matches("anything", spec("x"), "Debian")
    # rpm: [epoch:]version-release
    driver = spec("nvidia-driver", "570.133.20", upstream_only=True)
    assert expect.version_matches("3:570.133.20-1.el9", driver, "RedHat")
    assert not expect.version_matches("3:570.133.21-1.el9", driver, "RedHat")
    assert expect.version_matches(
        "2.26.2-1+cuda12.8", spec("libnccl", "2.26.2-1+cuda12.8"), "RedHat"
    )
    assert expect.version_matches("1:4.4.1-1", spec("dcgm", "1:4.4.1-1"), "RedHat")


def test_held() -> None:
    apt = "libnccl2\nnvidia-open\nslurmd:amd64\n"
    assert expect.held(apt, "libnccl2", "Debian")
    assert expect.held(apt, "slurmd", "Debian")
    assert not expect.held(apt, "libnccl", "Debian")
    dnf = "nvidia-driver-3:570.133.20-1.el9.*\nlibnccl-2.26.2-1+cuda12.8.*\n"
    assert expect.held(dnf, "nvidia-driver", "RedHat")
    assert expect.held(dnf, "libnccl", "RedHat")
    assert not expect.held(dnf, "nvidia-driver-cuda", "RedHat")


def _lab_vars(tmp_path: Path) -> dict[str, Any]:
    """The lab example's variables of a GPU compute node, merged as ansible-inventory does."""
    render_cluster(load_cluster(LAB_EXAMPLE), tmp_path / "r")
    merged: dict[str, Any] = {}
    for name in ("all", "ng_gpu"):
        text = (tmp_path / "r" / "group_vars" / f"{name}.yml").read_text(encoding="utf-8")
        merged.update(yaml.safe_load(text))
    merged["group_names"] = ["ng_gpu", "gpu", "nvswitch", "rdma", "role_compute"]
    return merged


def test_expectations_of_the_lab_example(tmp_path: Path) -> None:
    hv = _lab_vars(tmp_path)
    driver = expect.driver_packages(hv, "Debian")
    assert {p.version for p in driver} == {f"{hv['nvidia_driver_version']}-1"}
    assert all(p.held for p in driver)
    fm = expect.fabric_manager_packages(hv, "Debian")
    assert [p.name for p in fm] == ["nvidia-fabricmanager-570", "libnvidia-nscq-570"]
    assert expect.nccl_tests(hv).prefix == f"/opt/nccl-tests/{hv['nccl_tests_version']}"
    assert [p.version for p in expect.dcgm_packages(hv, "Debian")] == [
        f"1:{hv['dcgm_version']}-1"
    ] * 2
    assert expect.slurm_packages(hv, "Debian", "compute") == [
        expect.PackageSpec("slurmd"),
        expect.PackageSpec("slurm-client"),
    ]
    pinned = {**hv, "slurm_node_package_version": "22.05.8"}
    assert expect.slurm_packages(pinned, "Debian", "compute")[0] == expect.PackageSpec(
        "slurmd", "22.05.8", upstream_only=True, held=True
    )
    # the lab: inbox stack; nvidia-peermem only where the kernel has the peer memory API
    assert expect.peermem_wanted(hv)
    assert not expect.peermem_loads(hv, kernel_has_peer_api=False)
    assert expect.peermem_loads(hv, kernel_has_peer_api=True)
    assert expect.peermem_loads({**hv, "rdma_stack": "doca-ofed"}, kernel_has_peer_api=False)
    assert not expect.peermem_loads({**hv, "group_names": ["rdma"]}, kernel_has_peer_api=True)
    assert not expect.peermem_loads({**hv, "rdma_peermem": False}, kernel_has_peer_api=True)


def test_missing_variables_fail_never_default(tmp_path: Path) -> None:
    hv = _lab_vars(tmp_path)
    del hv["nvidia_driver_version"]
    with pytest.raises(ConfigError, match="nvidia_driver_version"):
        expect.driver_packages(hv, "Debian")
    with pytest.raises(ConfigError, match="gpuctl_gpu"):
        expect.gpu_spec({"gpuctl_gpu": None})
    with pytest.raises(ConfigError, match="group_names"):
        expect.groups({})


def test_fabric_manager_reported_version() -> None:
    text = "Fabric Manager version is : 570.172.08\n"
    assert expect.fabric_manager_reported_version(text) == "570.172.08"
    assert expect.fabric_manager_reported_version("nv-fabricmanager: error\n") is None


def _role_list(role: str, family: str, var: str, **context: str) -> list[str]:
    """A role variable of vars/<family>.yml, its Jinja rendered with ``context``."""
    data = yaml.safe_load((playbooks_dir() / "roles" / role / "vars" / f"{family}.yml").read_text())
    value = data[var]
    env = jinja2.Environment(autoescape=False)  # noqa: S701 - package names, not HTML
    if isinstance(value, str):
        return list(ast.literal_eval(env.from_string(value).render(**context).strip()))
    if isinstance(value, dict):
        value = value[context["key"]]
    return [env.from_string(str(v)).render(**context) for v in value]


# the vars file each role loads per family (Ubuntu falls back to its os_family, Debian)
_VARS_FILE = {
    "Debian": {"rdma": "Debian"},
    "Ubuntu": {"rdma": "Ubuntu-22", "validation_tools": "Debian", "slurm": "Debian"},
    "RedHat": {},
}


@pytest.mark.parametrize("family", ["Debian", "Ubuntu", "RedHat"])
def test_package_names_agree_with_the_roles(family: expect.OsFamily, tmp_path: Path) -> None:
    """expect.py names the packages the roles install, per OS family."""
    hv = {**_lab_vars(tmp_path), "nvidia_driver_version": "570.133.20"}
    files = _VARS_FILE[family]
    for modules in ("open", "proprietary"):
        specs = expect.driver_packages({**hv, "nvidia_driver_kernel_modules": modules}, family)
        want = _role_list(
            "nvidia_driver",
            family,
            "__nvidia_driver_packages",
            key=modules,
            __nvidia_driver_branch="570",
        )
        assert sorted(p.name for p in specs) == sorted(want), (family, modules)
    fm = [p.name for p in expect.fabric_manager_packages(hv, family)]
    assert fm == _role_list(
        "fabric_manager", family, "__fabric_manager_packages", __fabric_manager_branch="570"
    )
    nccl = [p.name for p in expect.nccl_packages(hv, family)]
    assert nccl == _role_list("nccl", family, "__nccl_packages")
    tools = [p.name for p in expect.validation_tool_packages(hv, family)]
    vt = files.get("validation_tools", family)
    assert tools == _role_list("validation_tools", vt, "__validation_tools_packages")
    sl = files.get("slurm", family)
    kinds: tuple[tuple[Literal["compute", "controller"], str], ...] = (
        ("compute", "slurm_node"),
        ("controller", "slurm_controller"),
    )
    for kind, role in kinds:
        got = [p.name for p in expect.slurm_packages(hv, family, kind)]
        assert got == _role_list(role, sl, f"__{role}_packages"), (family, kind)
    rdma = [p.name for p in expect.rdma_packages(hv, family)]
    assert rdma == _role_list("rdma", files.get("rdma", family), "__rdma_inbox_packages")
    dcgm = [p.name for p in expect.dcgm_packages(hv, family)]
    assert dcgm == _role_list("dcgm", "main", "__dcgm_packages", dcgm_cuda_major="12")
    assert [p.name for p in [expect.PackageSpec("munge")]] == _role_list(
        "munge", "RedHat" if family == "RedHat" else "Debian", "__munge_packages"
    )


# ------------------------------------------------------------------------------------------
# CLI and packaging


def _result(status: Status, tmp_path: Path) -> AcceptanceResult:
    run = AcceptanceRun(
        tmp_path, tmp_path / "inventory.yml", ("a", "b"), tmp_path / "j.xml", (), (), {}
    )
    tests = (
        TestOutcome("t[ansible://a]", "a", "passed"),
        TestOutcome("t[ansible://b]", "b", "failed" if status == "failed" else "passed"),
        TestOutcome("u[ansible://b]", "b", "skipped", "Skipped: not applicable: b"),
    )
    return AcceptanceResult(
        run,
        {"passed": 0, "failed": 1}.get(status, 2),
        status,
        tests,
        1.0,
    )


@pytest.mark.parametrize(("status", "code"), [("passed", 0), ("failed", 1), ("error", 2)])
def test_cli_exit_codes(
    status: Status, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake(cluster: Path, **kwargs: Any) -> AcceptanceResult:
        seen.update(kwargs, cluster=cluster)
        return _result(status, tmp_path)

    monkeypatch.setattr(acceptance_cmd, "run_acceptance", fake)
    res = CliRunner().invoke(
        app,
        [
            "acceptance",
            "c.yml",
            "--limit",
            "gpu[001-002]",
            "--junit",
            "r.xml",
            "--tests",
            "x",
            "--tests",
            "y",
        ],
    )
    assert res.exit_code == code, res.output
    assert seen["limit"] == "gpu[001-002]"
    assert seen["junit"] == Path("r.xml")
    assert seen["test_dirs"] == (Path("x"), Path("y"))
    assert f"acceptance {status}:" in res.output
    assert "1 skipped (not applicable)" in res.output


def test_cli_config_errors_exit_2(cluster_yml: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["acceptance", str(cluster_yml), "--tests", str(tmp_path / "missing")]
    )
    assert res.exit_code == 2, res.output
    assert "not a folder" in res.output
    res = CliRunner().invoke(app, ["acceptance", str(tmp_path / "nope.yml")])
    assert res.exit_code == 2, res.output


def test_wheel_ships_the_suite_and_the_playbooks(tmp_path: Path) -> None:
    hatchling = Path(sys.executable).parent / "hatchling"
    subprocess.run(
        [str(hatchling), "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "gpuctl/acceptance/conftest.py",
        "gpuctl/acceptance/plugin.py",
        "gpuctl/acceptance/runner.py",
        "gpuctl/acceptance/test_gpu_stack.py",
        "gpuctl/acceptance/test_munge.py",
        "gpuctl/acceptance/test_rdma.py",
        "gpuctl/acceptance/test_slurm.py",
        "gpuctl/_playbooks/roles/nvidia_driver/defaults/main.yml",
    ):
        assert name in names, name


def test_repository_test_run_does_not_collect_the_suite() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["gpuctl"]


def test_docs_list_every_shipped_test() -> None:
    doc = (ROOT / "docs" / "acceptance.md").read_text(encoding="utf-8")
    suite = ROOT / "gpuctl" / "acceptance"
    names = [
        m.group(1)
        for path in sorted(suite.glob("test_*.py"))
        for m in re.finditer(r"^def (test_\w+)\(", path.read_text(encoding="utf-8"), re.M)
    ]
    assert len(names) > 20
    assert [n for n in names if f"`{n}" not in doc] == []
