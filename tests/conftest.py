"""Shared fixtures: a plain terminal for every test, and a valid cluster document to break."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from gpuctl.starter import starter

if TYPE_CHECKING:
    from lab_helpers import ProvisionedLab


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
    """Lab tests on the shared provisioned lab run last, together, in _SHARED_ORDER (the other
    lab tests take the lab down and up for themselves)."""

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
