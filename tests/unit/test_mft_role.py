"""software.mft from cluster.yml to the nodes: what `gpuctl render` passes to the mft role, the
play that runs it (compute nodes with fabric NICs, after the RDMA stack), the role's inputs and
package specs, and the role run for real on this machine (local connection) where it must do
nothing (no pin) or stop at its preflight (a version without its build number)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT
from playbook_run import ansible_playbook

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.lab.repo import load_specs
from gpuctl.render import render_files
from gpuctl.starter import starter

PLAYBOOKS = ROOT / "playbooks"
ROLE = PLAYBOOKS / "roles" / "mft"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _all_vars(text: str) -> dict[str, Any]:
    data = yaml.safe_load(render_files(load_cluster_text(text, "c"))["group_vars/all.yml"])
    assert isinstance(data, dict)
    return data


# ------------------------------------------------------------------------------------------
# render


def test_render_passes_the_pin_under_the_roles_prefix() -> None:
    lab = _all_vars(starter("lab", 2))
    assert lab["mft_version"] == "4.26.1-3"
    # every mft_ variable render writes is an input of the role
    defaults = _yaml(ROLE / "defaults" / "main.yml")
    assert {k for k in lab if k.startswith("mft_")} <= set(defaults)


def test_no_pin_renders_null_and_the_role_defaults_to_nothing() -> None:
    doc = yaml.safe_load(starter("hgx-h100", 2))
    assert "mft" not in doc["software"]  # the starter only shows it, commented
    assert _all_vars(starter("hgx-h100", 2))["mft_version"] is None
    assert _yaml(ROLE / "defaults" / "main.yml")["mft_version"] is None
    for path in sorted((ROOT / "inventories").glob("*.yml")):
        pin = load_cluster(path).software.mft
        rendered = yaml.safe_load(render_files(load_cluster(path))["group_vars/all.yml"])
        assert rendered["mft_version"] == pin, path.name


def test_the_lab_pins_the_lab_repositorys_mft() -> None:
    """The lab's cluster.yml pins the version its package repository serves."""
    served = {s.name: s.version for s in load_specs()}
    assert load_cluster_text(starter("lab", 2), "lab").software.mft == served["mft"]


# ------------------------------------------------------------------------------------------
# the play and the role


def test_site_yml_runs_mft_after_the_rdma_stack_on_compute_nodes_with_nics() -> None:
    site = [p["ansible.builtin.import_playbook"] for p in _yaml(PLAYBOOKS / "site.yml")]
    assert site.index("rdma.yml") < site.index("mft.yml") < site.index("slurm.yml")
    (play,) = _yaml(PLAYBOOKS / "mft.yml")
    assert play["hosts"] == "rdma:&role_compute"
    assert play["roles"] == [{"role": "mft"}]


def test_every_step_is_skipped_without_a_version() -> None:
    steps = _yaml(ROLE / "tasks" / "main.yml")
    assert [s["name"] for s in steps] == ["Preflight", "Install"]
    for step in steps:
        assert step["when"] == "mft_version | default('', true) | length > 0"
        assert set(step["tags"]) == {"mft", "mft_install"}


def test_argument_specs_describe_the_defaults() -> None:
    options = _yaml(ROLE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = _yaml(ROLE / "defaults" / "main.yml")
    assert options["mft_version"]["type"] == "str"
    assert "default" not in options["mft_version"]  # null: the role does nothing
    assert options["mft_hold"] == {**options["mft_hold"], "type": "bool", "default": True}
    assert defaults["mft_hold"] is True


@pytest.mark.parametrize(
    ("family", "spec"), [("Debian", "mft=4.26.1-3"), ("RedHat", "mft-4.26.1-3")]
)
def test_package_specs_per_family(family: str, spec: str) -> None:
    packages = _yaml(ROLE / "vars" / "main.yml")["__mft_packages"]
    # the specs are the shared pinned_packages role's: name, its separator, the version
    separator = _yaml(ROLE.parent / "pinned_packages" / "vars" / "main.yml")[
        "__pinned_packages_separator"
    ][family]
    assert [f"{p}{separator}4.26.1-3" for p in packages] == [spec]


def _preflight_pattern() -> str:
    steps = _yaml(ROLE / "tasks" / "preflight.yml")
    (check,) = [s for s in steps if s["name"] == "Require the MFT version with its build number"]
    m = re.search(r"is match\('(.+)'\)", check["ansible.builtin.assert"]["that"][0])
    assert m is not None
    return m.group(1)


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("4.26.1-3", True),
        ("4.30.1-113", True),
        ("4.34.0-145", True),
        ("4.30.1", False),  # no build number: apt and dnf match no package
        ("mft-4.30.1-113", False),
        ("", False),
    ],
)
def test_the_preflight_wants_the_full_package_version(version: str, ok: bool) -> None:
    assert bool(re.match(_preflight_pattern(), version)) is ok


def test_a_missing_package_names_the_settings_to_change() -> None:
    text = _yaml(ROLE / "vars" / "main.yml")["__mft_no_source"]
    for setting in ("software.mft", "software.rdma.stack", "package_sources.doca"):
        assert setting in text


# ------------------------------------------------------------------------------------------
# the play run for real, on this machine


def _play(tmp: Path, version: str | None) -> subprocess.CompletedProcess[str]:
    """playbooks/mft.yml on local hosts: 'nic' is a compute node with fabric NICs, 'ctl' a
    controller with NICs and 'cpu' a compute node without (neither is the play's)."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "vars": {**local, "ansible_become": False, "mft_version": version},
            "children": {
                "rdma": {"hosts": {"nic": None, "ctl": None}},
                "role_compute": {"hosts": {"nic": None, "cpu": None}},
                "role_controller": {"hosts": {"ctl": None}},
            },
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory), encoding="utf-8")
    env = {
        "ANSIBLE_ROLES_PATH": str(ROLE.parent),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "ANSIBLE_GATHER_SUBSET": "min",
    }
    args = ["-i", str(tmp / "inventory.yml"), str(PLAYBOOKS / "mft.yml")]
    return ansible_playbook(tmp, args, env)


def _recap(stdout: str) -> dict[str, dict[str, int]]:
    out = {}
    for m in re.finditer(r"^(\S+)\s+: ((?:\w+=\d+\s*)+)$", stdout, re.M):
        out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


def test_without_a_pin_the_play_changes_nothing_and_only_targets_nodes_with_nics(
    tmp_path: Path,
) -> None:
    res = _play(tmp_path, None)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recap = _recap(res.stdout)
    assert set(recap) == {"nic"}
    assert recap["nic"]["changed"] == 0
    assert recap["nic"]["failed"] == 0
    assert "skipping: [nic]" in res.stdout


def test_a_version_without_its_build_number_stops_at_the_preflight(tmp_path: Path) -> None:
    res = _play(tmp_path, "4.30.1")
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    assert _recap(res.stdout)["nic"]["failed"] == 1
    assert "mft_version (cluster.yml software.mft) must be the mft package's version" in res.stdout
    assert "apt-cache" not in res.stdout  # nothing of the install ran
