"""`gpuctl acceptance` on the shared provisioned lab (tests/lab/conftest.py): the suite passes
on every host with a JUnit report listing tests per host; one thing broken on one node fails
exactly that test on exactly that node; the documented plain pytest command works.

Real SSH with host keys checked (testinfra's Ansible backend over the rendered inventory), real
systemd, apt, munge and Slurm in the lab's nodes; the NVIDIA and InfiniBand packages are the
lab repository's stand-ins under their real names and versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped
from lab_helpers import COMPUTE, NODES, ProvisionedLab, render_lab, sh

from gpuctl.acceptance.runner import host_of
from gpuctl.lab import lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

GPUCTL = str(Path(sys.executable).parent / "gpuctl")
HOSTS = list(NODES)
USER_TEST = """
def test_hostname_is_the_inventory_name(node):
    assert node.check_output("hostname").strip() == node.name
"""


@pytest.fixture
def cluster(provisioned_lab: ProvisionedLab) -> Path:
    return provisioned_lab.cluster


def _acceptance(cluster: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTL, "acceptance", str(cluster), "--state-dir", str(tmp / "state"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _outcomes(junit: Path) -> dict[tuple[str, str | None], str]:
    """(test name without parameters, host) -> passed / failed / error / skipped."""
    out: dict[tuple[str, str | None], str] = {}
    for suite in JUnitXml.fromfile(str(junit)):
        for case in suite:
            kind = "passed"
            for result in case.result:
                if isinstance(result, Failure):
                    kind = "failed"
                elif isinstance(result, Error):
                    kind = "error"
                elif isinstance(result, Skipped):
                    kind = "skipped"
            name = str(case.name)
            host = host_of(name, HOSTS)
            base, _, params = name.partition("[")
            extra = params.rstrip("]").removeprefix(f"ansible://{host}").lstrip("-")
            out[(f"{base}[{extra}]" if extra else base, host)] = kind
    return out


def test_acceptance_passes_on_a_provisioned_lab(cluster: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "test_site.py").write_text(USER_TEST, encoding="utf-8")
    junit = tmp_path / "acceptance.xml"
    res = _acceptance(cluster, tmp_path, "--junit", str(junit), "--tests", str(mine))
    assert res.returncode == 0, res.stderr[-6000:]
    outcomes = _outcomes(junit)
    assert {host for _, host in outcomes} == set(HOSTS)
    bad = {k: v for k, v in outcomes.items() if v in ("failed", "error")}
    assert bad == {}
    per_host = {h: Counter(v for (_, host), v in outcomes.items() if host == h) for h in HOSTS}
    for host in HOSTS:
        assert per_host[host]["passed"] >= 8, (host, per_host[host])
    for host in COMPUTE:
        for test in (
            "test_driver_packages_pinned_and_held",
            "test_driver_loaded_at_pinned_version",
            "test_device_nodes",
            "test_persistenced_active",
            "test_fabric_manager_at_driver_version",
            "test_fabric_manager_binary_version",
            "test_fabric_manager_active",
            "test_nccl_packages_pinned_and_held",
            "test_nccl_tests_built",
            "test_dcgm_packages_pinned_and_held",
            "test_dcgm_active",
            "test_rdma_stack_packages",
            "test_rdma_devices_present",
            "test_validation_tools",
            "test_perftest_with_cuda",
            "test_munge_key_owner_and_mode",
            "test_munge_key_is_the_clusters",
            "test_slurmd_active",
            "test_slurm_reaches_controller",
            "test_slurm_node_state",
            "test_slurm_config_matches_render[slurm.conf]",
            "test_slurm_config_matches_render[gres.conf]",
            "test_hostname_is_the_inventory_name",
        ):
            assert outcomes[(test, host)] == "passed", (test, host)
        # the lab's inbox stack: no peer memory API, so GPUDirect RDMA through DMA-BUF
        assert outcomes[("test_nvidia_peermem_loaded", host)] == "skipped"
    for test in (
        "test_slurmctld_active",
        "test_slurmctld_answers",
        "test_munge_key_owner_and_mode",
    ):
        assert outcomes[(test, "ctl01")] == "passed", test
    assert outcomes[("test_driver_packages_pinned_and_held", "ctl01")] == "skipped"
    assert "skipped (not applicable)" in res.stderr


def test_one_broken_thing_fails_one_test_on_one_host(cluster: Path, tmp_path: Path) -> None:
    gpu002 = lab.address_of("gpu002")
    assert sh(gpu002, "chmod 0644 /etc/munge/munge.key").returncode == 0
    try:
        junit = tmp_path / "broken.xml"
        res = _acceptance(cluster, tmp_path, "--junit", str(junit))
    finally:
        assert sh(gpu002, "chmod 0600 /etc/munge/munge.key").returncode == 0
    assert res.returncode == 1, res.stderr[-6000:]
    outcomes = _outcomes(junit)
    failed = sorted(k for k, v in outcomes.items() if v in ("failed", "error"))
    assert failed == [("test_munge_key_owner_and_mode", "gpu002")]
    assert "mode 0644" in res.stdout + res.stderr


def test_plain_pytest_command_of_the_docs(cluster: Path, tmp_path: Path) -> None:
    """docs/acceptance.md: pytest --pyargs gpuctl.acceptance on `gpuctl render`'s output with
    the known_hosts copied beside it."""
    rendered = render_lab(cluster, tmp_path / "rendered")
    inventory = rendered / "inventory.yml"
    junit = tmp_path / "plain.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_CONFIG"] = str(inventory.parent / "ansible.cfg")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--pyargs",
            "gpuctl.acceptance",
            "--hosts=ansible://gpu001",
            f"--ansible-inventory={inventory}",
            f"--junitxml={junit}",
            "-k",
            "munge or slurm",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert plain.returncode == 0, plain.stdout[-4000:]
    outcomes = _outcomes(junit)
    assert outcomes[("test_munge_key_owner_and_mode", "gpu001")] == "passed"
    assert outcomes[("test_slurmd_active", "gpu001")] == "passed"
