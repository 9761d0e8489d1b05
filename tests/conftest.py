"""The one conftest: the test tiers (unit, integration, lab), a plain terminal for every test,
the shared fixtures (a valid cluster document to break, the lab's cluster.yml, the lab itself).

Plain constants and functions (ROOT, write_lab_cluster, require_tool) are in tests/helpers.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from helpers import write_lab_cluster

from gpuctl.starter import starter

if TYPE_CHECKING:
    from lab_helpers import ProvisionedLab

# --- tiers ------------------------------------------------------------------------------------
# Every test is in exactly one tier, and `pytest -m unit|integration|lab` runs it:
# - lab: marked in its module (tests/lab/); needs root and the lab.
# - integration: starts a real program (ansible-playbook, pytest, promtool, Chromium, sshd, a
#   role's script, gpuctl's own entry points, a worker process), or fuzzes or exhausts (fuzzers,
#   property tests, a kill at every call, 100,000 nodes); listed here, by module or by test.
# - unit: everything else; pure Python, the whole tier in under a minute on 2 cores. A unit test
#   that starts a process fails, naming this list.

# modules whose every test is an integration test (what they run)
INTEGRATION_MODULES = frozenset(
    {
        "test_acceptance.py",  # the acceptance suite: ansible-playbook running pytest on hosts
        "test_lab_cluster.py",  # the lab's cluster.yml through gpuctl's entry points
        "test_lab_repo.py",  # dpkg-deb, dpkg-scanpackages, apt-get on the lab repository
        "test_lab_sim_bmc.py",  # the simulated BMCs served over TLS on 127.0.0.1, in real time
        "test_loader_fuzz.py",  # fuzzes the loader (hypothesis)
        "test_nvidia_driver_service.py",  # the role's service script under ansible-playbook
        "test_parser_fuzz.py",  # fuzzes every parser
        "test_preflight_gate.py",  # the preflight role under ansible-playbook (module fixture)
        "test_provision.py",  # ansible-runner runs of real playbooks
        "test_roce_qos_script.py",  # the roce_qos script, run
        "test_rollout_property.py",  # property-based rollouts (hypothesis)
        "test_sec_render_fuzz.py",  # fuzzes every rendered string
        "test_slurm_source.py",  # the Slurm roles under ansible-playbook
        "test_pinned_packages.py",  # the shared pin-and-hold role under ansible-playbook, apt
        "test_sshnodes.py",  # sshd-only nodes for the benchmark
    }
)

# single integration tests in modules that are otherwise unit tests ("module::test")
INTEGRATION_TESTS = frozenset(
    {
        "test_cli_errors.py::test_entry_point_exit_codes",
        "test_collect.py::test_paramiko_reports_a_command_that_outlives_its_wait_as_timed_out",
        "test_collect.py::test_paramiko_runs_commands_with_exit_code_stdout_and_stderr",
        "test_driver_lifecycle.py::test_persistence_mode_drop_in_where_the_packaged_unit_disables_it",
        "test_driver_lifecycle.py::test_secure_boot_stops_before_the_install_unless_the_modules_are_signed",
        "test_lab_sim.py::test_device_script_makes_char_devices_and_answers_modprobe",
        "test_lab_sim.py::test_ib_write_bw_port_down_on_the_client_fails_both",
        "test_lab_sim.py::test_ib_write_bw_port_down_on_the_server_fails_both",
        "test_lab_sim.py::test_ib_write_bw_port_goes_down_while_the_server_waits",
        "test_lab_sim.py::test_ib_write_bw_server_and_client",
        "test_lab_sim.py::test_ib_write_bw_slower_side_limits_both",
        "test_lab_sim.py::test_standin_faulty_node",
        "test_lab_sim.py::test_standin_subprocess",
        "test_lab_sim_driver.py::test_the_packaged_boot_hook_and_modprobe_load_the_module",
        "test_lab_sim_qos.py::test_script_check_apply_check_on_a_fresh_roce_node",
        "test_lab_slurm_repo.py::test_the_lab_asks_for_schedmds_packages_at_the_version_it_serves",
        "test_latency.py::test_ib_write_lat_server_and_client_both_print_the_slower_links_table",
        "test_mft_role.py::test_a_version_without_its_build_number_stops_at_the_preflight",
        "test_mft_role.py::test_without_a_pin_the_play_changes_nothing_and_only_targets_nodes_with_nics",
        "test_nccl_hpcx.py::test_which_locks_are_dropped",
        "test_nodecheck.py::test_run_local_keeps_the_exit_status_and_output",
        "test_nodecheck.py::test_run_local_kills_what_ignores_sigterm",
        "test_nodecheck.py::test_run_local_reports_a_signal_as_an_error",
        "test_nodecheck.py::test_run_local_reports_missing_and_unrunnable_commands",
        "test_nodecheck.py::test_run_local_times_out_and_ends_the_whole_process_group",
        "test_nodecheck.py::test_the_light_entry_point_imports_no_heavy_module",
        "test_nodecheck_cli.py::test_the_light_entry_point_is_installed_and_starts",
        "test_nodecheck_role.py::test_the_light_entry_point_needs_nothing_beyond_the_requirements",
        "test_preflight_role.py::test_the_missing_bindings",
        "test_render.py::test_real_ansible_reads_the_rendered_inventory_and_config",
        "test_render.py::test_render_is_deterministic_and_byte_identical",
        "test_reports.py::test_html_renders_in_headless_chromium",
        "test_reports.py::test_prometheus_textfile_passes_promtool",
        "test_reports.py::test_write_reports_in_forked_workers_writes_the_same",
        "test_roce_nccl.py::test_check_reports_and_apply_sets_the_cnp_class",
        "test_roce_nccl.py::test_no_cnp_sysfs_is_a_note_not_drift",
        # exhaustive: the rollout killed at every call, then resumed
        "test_rollout_executor.py::test_killed_anywhere_with_the_staged_version_hidden_still_ends_at_target",
        "test_rollout_executor.py::test_killed_at_any_call_and_resumed_ends_like_an_uninterrupted_run",
        "test_rollout_store.py::test_the_lock_is_exclusive_and_names_the_holder",
        # the lab's cluster.yml names the lab's SSH key, which ssh-keygen makes on first use (a
        # fresh machine's unit tier failed on it; CI's ran after the benchmarks had made it)
        "test_rollout_bmc.py::test_the_lab_cluster_yml_points_at_the_lab_bmc_files",
        "test_sec_bundle.py::test_a_judge_that_raises_in_a_worker_process_fails_that_node_only",
        # scale: 100,000 bad names
        "test_sec_cluster_yml.py::test_a_hundred_thousand_bad_node_names_give_a_bounded_number_of_messages",
        "test_sec_cluster_yml.py::test_check_refuses_a_device_without_reading_it",
        "test_sec_cluster_yml.py::test_check_refuses_a_huge_file_before_reading_it",
        "test_sec_cluster_yml.py::test_millions_of_nodes_in_all_are_refused_with_one_line",
        "test_sec_cluster_yml.py::test_proxy_command_passes_the_key_path_as_one_word_and_runs_nothing",
        "test_sec_parsers.py::test_every_number_replaced_by_a_huge_integer",  # fuzzes
        "test_sec_parsers.py::test_one_number_at_a_time_replaced_by_a_huge_integer",  # fuzzes
        "test_sec_reports.py::test_prometheus_textfile_follows_the_line_grammar",
    }
)


def _tier(item: pytest.Item) -> str:
    if item.get_closest_marker("lab") is not None:
        return "lab"
    module = item.path.name
    name = getattr(item, "originalname", item.name)
    if module in INTEGRATION_MODULES or f"{module}::{name}" in INTEGRATION_TESTS:
        return "integration"
    return "unit"


# the unit test now running (its setup, call and teardown), while there is one
_running_unit: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if item.get_closest_marker("unit") is not None:
        _running_unit.append(item)
    try:
        return (yield)
    finally:
        _running_unit.clear()


def _refused(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, except while a unit test (or a fixture of it) runs: then that test fails."""

    def guard(*args: Any, **kw: Any) -> Any:
        if not _running_unit or _importing():
            return original(*args, **kw)
        item = _running_unit[0]
        key = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        what = repr(args[1] if name.endswith("_execute_child") else args[:1])[:120]
        pytest.fail(
            f"a unit test started a process ({name} {what}): make it pure, or list {key!r}"
            " in INTEGRATION_TESTS in tests/conftest.py",
            pytrace=False,
        )

    return guard


def _importing() -> bool:
    """Whether a module is being imported or a library looked up: what a library does then
    (ansible's first import runs ``ldconfig -p`` for ctypes.util.find_library) is not the test's."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<frozen importlib") or name.endswith("ctypes/util.py"):
            return True
        frame = frame.f_back
    return False


_STARTERS = (
    (subprocess.Popen, "_execute_child"),  # subprocess.run, check_output, asyncio, ...
    (os, "fork"),  # multiprocessing, ...
    (os, "forkpty"),  # pexpect (ansible-runner), pty.fork
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
)
_saved: list[tuple[object, str, Any]] = []


def pytest_configure(config: pytest.Config) -> None:
    for owner, name in _STARTERS:
        original = getattr(owner, name)
        _saved.append((owner, name, original))
        setattr(owner, name, _refused(f"{getattr(owner, '__name__', owner)}.{name}", original))


def pytest_unconfigure(config: pytest.Config) -> None:
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)


@pytest.fixture(autouse=True)
def _plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """No colours and wide lines, so output is stable and one problem stays on one line."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


@cache
def _valid_text() -> str:
    return starter("hgx-h100", 4)


@pytest.fixture
def valid_doc() -> dict[str, Any]:
    """A fresh dict of a valid cluster (the hgx-h100 starter with 4 nodes); safe to mutate."""
    doc = yaml.safe_load(_valid_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture
def cluster_yml(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The lab starter's cluster.yml in tmp_path, its known_hosts beside it: ctl01 + gpu001..
    gpu003 (8x H100, 8 NDR HCAs), or as many GPU nodes as the test module's LAB_NODES says."""
    return write_lab_cluster(tmp_path, getattr(request.module, "LAB_NODES", 3))


# --- the shared provisioned lab (lab tests; helpers in tests/lab/lab_helpers.py) -------------

# the order of the modules that share the provisioned lab
_SHARED_ORDER = (
    "test_lab_provision",
    "test_lab_acceptance",
    "test_lab_validate",
    "test_lab_faults",
    "test_lab_node_check",
    "test_lab_rollout",
    "test_lab_bmc",
    "test_lab_rollout_bmc",
    "test_lab_rollout_driver",
    "test_lab_multinode",
)


@pytest.fixture(scope="session")
def provisioned_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProvisionedLab]:
    """A fresh lab with three compute nodes: `gpuctl provision --check`, then `gpuctl
    provision`, both through the CLI with --json; the records are kept for the tests about them.
    The tests that use it run last and together (see pytest_collection_modifyitems); each leaves
    the lab as healthy as it found it."""
    from lab_helpers import COMPUTE, NODES, ProvisionedLab, gpuctl, installed_packages

    from gpuctl.lab import lab

    lab.down()
    lab.up(compute_nodes=len(COMPUTE))
    state = tmp_path_factory.mktemp("provisioned-lab")
    cluster = state / "cluster.yml"
    cluster.write_text((lab.lab_dir() / "cluster.yml").read_text(encoding="utf-8"))
    check = gpuctl("provision", str(cluster), "--check", "--json")
    assert check.returncode == 0, check.stderr[-3000:]
    installed = {n: installed_packages(n) for n in NODES}
    first = gpuctl("provision", str(cluster), "--json")
    assert first.returncode == 0, first.stderr[-5000:]
    yield ProvisionedLab(cluster, json.loads(check.stdout), json.loads(first.stdout), installed)
    lab.down()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker (see _tier). Lab tests on the shared provisioned lab run
    last, together, in _SHARED_ORDER (the other lab tests take the lab down and up for
    themselves)."""
    for item in items:
        tier = _tier(item)
        if tier != "lab":
            item.add_marker(getattr(pytest.mark, tier))

    def shared_rank(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        return _SHARED_ORDER.index(name) if name in _SHARED_ORDER else -1

    others = [i for i in items if shared_rank(i) < 0]
    shared = sorted((i for i in items if shared_rank(i) >= 0), key=shared_rank)  # stable
    items[:] = others + shared


@pytest.fixture(scope="module")
def running() -> Iterator[Any]:
    """A fresh lab with two compute nodes for one lab test module (down before and after)."""
    from gpuctl.lab import lab

    lab.down()
    result = lab.up(2)
    yield result
    lab.down()


@pytest.fixture(scope="module")
def render_dir(running: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`gpuctl render` of that lab, with its known_hosts beside the inventory."""
    from lab_helpers import render_lab

    out = tmp_path_factory.mktemp("lab-render")
    assert running.status.cluster_yml is not None
    render_lab(running.status.cluster_yml, out)
    return out
