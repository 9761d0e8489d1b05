"""The host checks of the preflight role that the lab cannot show on its own: the order of the
steps (kernel headers are looked up in a refreshed package index) and the Python bindings the
other roles' modules need on Debian and Ubuntu (python3-apt for apt, python3-debian for
deb822_repository), evaluated with ansible-playbook on this machine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT
from playbook_run import run_local_play

ROLES = ROOT / "playbooks" / "roles"
ROLE = ROLES / "preflight"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _files_in_order() -> list[str]:
    return [
        step["ansible.builtin.include_tasks"]["file"]
        for step in _yaml(ROLE / "tasks" / "main.yml")
        if "ansible.builtin.include_tasks" in step
    ]


def test_kernel_headers_are_looked_up_after_the_package_index_is_refreshed() -> None:
    order = _files_in_order()
    assert order.index("packages.yml") < order.index("kernel.yml"), order
    first = _yaml(ROLE / "tasks" / "packages.yml")[0]
    assert first["ansible.builtin.command"]["argv"] == "{{ __preflight_cache_command }}"
    # the headers query reads the index the refresh wrote
    kernel = (ROLE / "tasks" / "kernel.yml").read_text()
    assert "__preflight_headers_query" in kernel


def _roles_using(module: str) -> list[str]:
    return sorted(
        {
            p.relative_to(ROLES).parts[0]
            for p in ROLES.rglob("*.yml")
            if re.search(rf"^\s*(ansible\.builtin\.)?{module}:", p.read_text(), re.M)
        }
    )


def test_python3_debian_is_installed_where_a_role_writes_deb822_sources() -> None:
    users = _roles_using("deb822_repository")
    assert users, "no role uses deb822_repository: drop python3-debian from the preflight"
    packages = _yaml(ROLE / "vars" / "Debian.yml")["__preflight_python_packages"]
    assert packages == ["python3-apt", "python3-debian"], users
    (block,) = [
        t for t in _yaml(ROLE / "tasks" / "packages.yml") if "block" in t and "Python" in t["name"]
    ]
    assert block["when"] == "ansible_facts['os_family'] == 'Debian'"
    look, report, install = block["block"]
    assert look["ansible.builtin.command"]["argv"] == (
        "{{ __preflight_python_query + __preflight_python_packages }}"
    )
    assert look["check_mode"] is False
    assert look["changed_when"] is False
    # check mode reports what it cannot install; a normal run installs what is missing
    assert report["when"] == ["__preflight_python_missing | length > 0", "ansible_check_mode"]
    assert install["ansible.builtin.apt"]["name"] == "{{ __preflight_python_missing }}"
    assert install["when"] == "__preflight_python_missing | length > 0"


@pytest.mark.parametrize(
    ("dpkg_out", "missing"),
    [
        ("python3-apt installed\npython3-debian installed\n", []),
        ("python3-apt installed\n", ["python3-debian"]),  # dpkg-query: no packages found
        ("python3-apt installed\npython3-debian config-files\n", ["python3-debian"]),
        ("", ["python3-apt", "python3-debian"]),
    ],
)
def test_the_missing_bindings(dpkg_out: str, missing: list[str], tmp_path: Path) -> None:
    """vars/Debian.yml's __preflight_python_missing over dpkg-query's output, in Ansible."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(ROLE / "vars" / "Debian.yml")],
            "vars": {"__preflight_python_apt": {"stdout_lines": dpkg_out.splitlines()}},
            "tasks": [
                {
                    "name": "missing",
                    "ansible.builtin.debug": {"msg": "{{ __preflight_python_missing | to_json }}"},
                }
            ],
        }
    ]
    res = run_local_play(tmp_path, play, {"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.oneline"})
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"localhost \| SUCCESS => (\{.*\})$", res.stdout, re.M)
    assert m is not None, res.stdout
    assert json.loads(json.loads(m.group(1))["msg"]) == missing
