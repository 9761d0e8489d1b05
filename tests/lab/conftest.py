"""One provisioned lab for every lab test that needs one (provisioning takes minutes).

`provisioned_lab` brings up a fresh lab with three compute nodes, runs `gpuctl provision
--check` on it (nothing installed yet), then `gpuctl provision`, both as an operator would
(the CLI, --json), and keeps the results for the tests about them. The tests that use it run
one after the other, after every other lab test (those take the lab down and up for
themselves); each leaves the lab as healthy as it found it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from lab_helpers import COMPUTE, NODES, ProvisionedLab, gpuctl, installed_packages

from gpuctl.lab import lab

# the order of the modules that share the provisioned lab
_SHARED_ORDER = (
    "test_lab_provision",
    "test_lab_acceptance",
    "test_lab_validate",
    "test_lab_faults",
)


@pytest.fixture(scope="session")
def provisioned_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProvisionedLab]:
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
    """Tests on the shared provisioned lab run last, together, in _SHARED_ORDER."""

    def shared_rank(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        return _SHARED_ORDER.index(name) if name in _SHARED_ORDER else -1

    others = [i for i in items if shared_rank(i) < 0]
    shared = sorted((i for i in items if shared_rank(i) >= 0), key=shared_rank)  # stable
    items[:] = others + shared
