"""What the lab cannot show of the nccl and dcgm roles: nccl-tests built with HPC-X find its
libraries at run time, and on EL 9 an old versionlock does not block an upgrade.

nccl-tests link libmpi with ``-L$(MPI_HOME)/lib -lmpi`` and no rpath (NVIDIA/nccl-tests
src/Makefile at v2.14.1), and HPC-X unpacks outside the loader's path: without
/etc/ld.so.conf.d/gpuctl-hpcx.conf the binaries fail with "cannot open shared object file".
``dnf versionlock`` keeps the locked version only, so a lock on the old version hides the new
pin from dnf; the roles drop a lock on another version first, as the mft role does. The lock
conditions are evaluated by ansible-playbook on this machine against ``dnf versionlock list``
output in its format (name-epoch:version-release.*).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from helpers import ROOT
from playbook_run import run_local_play

ROLES = ROOT / "playbooks" / "roles"
NCCL = ROLES / "nccl"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _tasks(path: Path) -> list[dict[str, Any]]:
    """Every task of a task file, blocks opened."""
    out = []
    for task in _yaml(path):
        out += task.get("block", [task])
    return out


def _task(path: Path, name: str) -> dict[str, Any]:
    (task,) = [t for t in _tasks(path) if t["name"] == name]
    return task


# ------------------------------------------------------------------------------------------
# HPC-X


def _render_ld_conf(**context: Any) -> list[str]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in text.splitlines())
    role_vars = _yaml(NCCL / "vars" / "main.yml")
    context = {**_yaml(NCCL / "defaults" / "main.yml"), **context}
    context["__nccl_tests_hpcx_dir"] = env.from_string(role_vars["__nccl_tests_hpcx_dir"]).render(
        context
    )
    context["__nccl_hpcx_lib_dirs"] = role_vars["__nccl_hpcx_lib_dirs"]
    text = env.from_string((NCCL / "templates" / "gpuctl-hpcx.conf.j2").read_text()).render(
        ansible_managed="Ansible managed", **context
    )
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_hpcx_libraries_are_in_the_loaders_path() -> None:
    dirs = _render_ld_conf(nccl_tests_mpi_flavor="hpcx", nccl_tests_mpi_version="2.21")
    assert dirs == [
        "/opt/hpcx-2.21/ompi/lib",
        "/opt/hpcx-2.21/ucx/lib",
        "/opt/hpcx-2.21/ucc/lib",
        "/opt/hpcx-2.21/hcoll/lib",
        "/opt/hpcx-2.21/sharp/lib",
    ]
    # the MPI nccl-tests link against is the first of them
    mpi_home = _yaml(NCCL / "vars" / "main.yml")["__nccl_tests_mpi_home"]
    assert "__nccl_tests_hpcx_dir ~ '/ompi'" in mpi_home


def test_the_hpcx_path_writes_the_file_and_runs_ldconfig() -> None:
    install = NCCL / "tasks" / "install.yml"
    (block,) = [t for t in _yaml(install) if t["name"] == "HPC-X"]
    assert block["when"] == ["nccl_tests_enabled | bool", "nccl_tests_mpi_flavor == 'hpcx'"]
    names = [t["name"] for t in block["block"]]
    assert names.index("HPC-X unpacked") < names.index("HPC-X libraries in the loader's path")
    conf = _task(install, "HPC-X libraries in the loader's path")
    assert conf["ansible.builtin.template"]["dest"] == "{{ __nccl_hpcx_ld_conf }}"
    assert conf["notify"] == "nccl : Run ldconfig"
    assert _yaml(NCCL / "vars" / "main.yml")["__nccl_hpcx_ld_conf"] == (
        "/etc/ld.so.conf.d/gpuctl-hpcx.conf"
    )
    (handler,) = _yaml(NCCL / "handlers" / "main.yml")
    assert handler["listen"] == "nccl : Run ldconfig"
    assert handler["ansible.builtin.command"]["argv"] == ["ldconfig"]
    # back to openmpi (or no nccl-tests): the file goes, and the cache with it
    gone = _task(install, "No HPC-X libraries in the loader's path without HPC-X")
    assert gone["ansible.builtin.file"] == {"path": "{{ __nccl_hpcx_ld_conf }}", "state": "absent"}
    assert gone["when"] == "not (nccl_tests_enabled | bool and nccl_tests_mpi_flavor == 'hpcx')"
    assert gone["notify"] == "nccl : Run ldconfig"


# ------------------------------------------------------------------------------------------
# EL 9 versionlocks


# the roles pin through the shared pinned_packages role (its dnf.yml on EL)
PINNED_DNF = ROLES / "pinned_packages" / "tasks" / "dnf.yml"


def _lock_steps(role: str) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The vars the role passes to pinned_packages, the shared "Drop a lock" task, the names
    of the shared dnf steps."""
    install = ROLES / role / "tasks" / "install.yml"
    (include,) = [t for t in _yaml(install) if t["name"] == f"{role.upper()} at the pinned version"]
    assert include["ansible.builtin.include_role"] == {"name": "pinned_packages"}
    names = [t["name"] for t in _tasks(PINNED_DNF)]
    drop = _task(PINNED_DNF, "Drop a lock on another version: {{ pinned_packages_label }}")
    return include["vars"], drop, names


@pytest.mark.parametrize("role", ["dcgm", "nccl"])
def test_an_old_lock_goes_before_the_new_pin(role: str) -> None:
    pinned, drop, names = _lock_steps(role)
    assert names.index("Locked versions") < names.index(drop["name"])
    assert names.index(drop["name"]) < names.index(
        "At the pinned version (dnf): {{ pinned_packages_label }}"
    )
    assert drop["ansible.builtin.command"]["argv"] == [
        "dnf",
        "-q",
        "versionlock",
        "delete",
        "{{ item }}",
    ]
    assert drop["loop"] == "{{ pinned_packages_names }}"
    assert pinned["pinned_packages_names"] == f"{{{{ __{role}_packages }}}}"


def _dropped(role: str, pin: dict[str, str], locks: str, tmp: Path) -> list[str]:
    """The packages the role's "Drop a lock" task deletes the lock of, for ``locks``."""
    pinned, drop, _names = _lock_steps(role)
    packages = {
        "dcgm": ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"],
        "nccl": ["libnccl", "libnccl-devel"],
    }[role]
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                **_yaml(ROLES / "pinned_packages" / "defaults" / "main.yml"),
                **pinned,
                **pin,
                f"{role}_hold": True,
                f"__{role}_packages": packages,
                "__pinned_packages_locks": {"stdout": locks},
            },
            "tasks": [
                {
                    "name": "drop",
                    "ansible.builtin.debug": {"msg": "{{ item }}"},
                    "loop": drop["loop"],
                    "when": drop["when"],
                }
            ],
        }
    ]
    res = run_local_play(tmp, play, {"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.oneline"})
    assert res.returncode == 0, res.stdout + res.stderr
    if re.search(r"^localhost \| SKIPPED$", res.stdout, re.M):  # every item skipped
        return []
    m = re.search(r"^localhost \| \w+!? => (\{.*\})$", res.stdout, re.M)
    assert m is not None, res.stdout
    results = json.loads(m.group(1)).get("results", [])
    return [r["item"] for r in results if not r.get("skipped")]


DCGM_OLD = (
    "datacenter-gpu-manager-4-core-1:4.2.3-1.*\ndatacenter-gpu-manager-4-cuda12-1:4.2.3-1.*\n"
)
NCCL_OLD = "libnccl-0:2.21.5-1+cuda12.4.*\nlibnccl-devel-0:2.21.5-1+cuda12.4.*\n"


@pytest.mark.parametrize(
    ("role", "pin", "locks", "dropped"),
    [
        # an upgrade: both old locks go
        (
            "dcgm",
            {"dcgm_version": "4.4.1"},
            DCGM_OLD,
            ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"],
        ),
        # the pinned version locked already: nothing to drop (a second run changes nothing)
        ("dcgm", {"dcgm_version": "4.2.3"}, DCGM_OLD, []),
        # 4.2.3 is no prefix match for 4.2.30
        (
            "dcgm",
            {"dcgm_version": "4.2.3"},
            DCGM_OLD.replace("4.2.3-", "4.2.30-"),
            ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"],
        ),
        ("dcgm", {"dcgm_version": "4.4.1"}, "", []),
        ("nccl", {"nccl_version": "2.26.2-1+cuda12.8"}, NCCL_OLD, ["libnccl", "libnccl-devel"]),
        ("nccl", {"nccl_version": "2.21.5-1+cuda12.4"}, NCCL_OLD, []),
        # libnccl's pattern does not take libnccl-devel's lock for its own
        (
            "nccl",
            {"nccl_version": "2.26.2-1+cuda12.8"},
            "libnccl-devel-0:2.21.5-1+cuda12.4.*\n",
            ["libnccl-devel"],
        ),
        ("nccl", {"nccl_version": "2.26.2-1+cuda12.8"}, "", []),
    ],
)
def test_which_locks_are_dropped(
    role: str, pin: dict[str, str], locks: str, dropped: list[str], tmp_path: Path
) -> None:
    assert _dropped(role, pin, locks, tmp_path) == dropped


def test_the_lock_patterns_read_dnfs_format() -> None:
    """The "already locked" test of the add step matches what the drop step keeps."""
    for role, pin in (("dcgm", "4.2.3"), ("nccl", "2.21.5-1+cuda12.4")):
        _lock_steps(role)
        add = _task(PINNED_DNF, "Versionlock the packages: {{ pinned_packages_label }}")
        assert any(re.search(r"is not search\(", cond) for cond in add["when"]), (role, pin)
