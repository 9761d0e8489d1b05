"""slurm.health_check from cluster.yml to the nodes: the model and its rules, what `gpuctl render`
writes (slurm.conf, the role's variables, the nodes' copy of cluster.yml), and the
gpuctl_node_check role's hash-locked requirements, which must hold everything the light
`gpuctl-node-check` imports."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT
from packaging.requirements import Requirement

from gpuctl.config import load_cluster_text
from gpuctl.errors import ConfigError
from gpuctl.provision import wheelhouse
from gpuctl.remote import KILL_AFTER_S
from gpuctl.render import HEALTH_CHECK_PROGRAM, NODE_CLUSTER_YML, render_files
from gpuctl.starter import starter
from gpuctl.validation.expect import expectations
from gpuctl.validation.nodecheck import DEFAULT_CLUSTER, SCONTROL_TIMEOUT_S

ROLE = ROOT / "playbooks" / "roles" / "gpuctl_node_check"
EXAMPLES = sorted((ROOT / "inventories").glob("*.yml"))


def _enabled(text: str, **sources: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    doc["slurm"]["health_check"] = {"enabled": True, "interval_s": 60}
    doc.setdefault("package_sources", {}).update(
        sources or {"gpuctl_wheelhouse": "/srv/gpuctl/wheelhouse"}
    )
    assert isinstance(doc, dict)
    return doc


def _load(doc: dict[str, Any]) -> Any:
    return load_cluster_text(yaml.safe_dump(doc, sort_keys=False), "cluster.yml")


# ------------------------------------------------------------------------------------------
# cluster.yml and render


def test_off_by_default_nothing_in_slurm_conf_and_no_node_copy() -> None:
    files = render_files(load_cluster_text(starter("hgx-h100", 4), "c"))
    assert "HealthCheck" not in files["slurm/slurm.conf"]
    assert NODE_CLUSTER_YML not in files
    all_vars = yaml.safe_load(files["group_vars/all.yml"])
    assert all_vars["gpuctl_node_check_enabled"] is False
    assert all_vars["slurm_node_health_check_program"] == ""


def test_enabled_slurm_conf_names_the_program_and_the_role_gets_its_variables() -> None:
    doc = _enabled(starter("hgx-h100", 4))
    doc["slurm"]["health_check"]["node_state"] = ["IDLE", "CYCLE"]
    files = render_files(_load(doc))
    conf = files["slurm/slurm.conf"]
    assert f"\nHealthCheckProgram={HEALTH_CHECK_PROGRAM}\n" in conf
    assert "\nHealthCheckInterval=60\nHealthCheckNodeState=IDLE,CYCLE\n" in conf
    all_vars = yaml.safe_load(files["group_vars/all.yml"])
    assert all_vars["slurm_node_health_check_program"] == HEALTH_CHECK_PROGRAM
    assert all_vars["gpuctl_node_check_enabled"] is True
    assert all_vars["gpuctl_node_check_wheelhouse"] == "/srv/gpuctl/wheelhouse"
    assert all_vars["gpuctl_node_check_cluster_src"] == "{{ inventory_dir }}/gpuctl/cluster.yml"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", all_vars["gpuctl_node_check_version"])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_nodes_copy_of_cluster_yml_loads_to_the_same_expectations(path: Path) -> None:
    doc = _enabled(
        path.read_text(encoding="utf-8"),
        pypi_index="https://user:s3cret@pypi.example.com/simple",
        http_proxy="http://proxyuser:pw@proxy.example.com:3128",
    )
    cluster = _load(doc)
    copy = render_files(cluster)[NODE_CLUSTER_YML]
    assert "s3cret" not in copy
    assert "proxyuser" not in copy
    node_doc = yaml.safe_load(copy)
    assert "ssh" not in node_doc
    assert "package_sources" not in node_doc
    assert "health_check" not in node_doc["slurm"]
    again = load_cluster_text(copy, "node copy")
    assert expectations(again) == expectations(cluster)
    assert again.validation == cluster.validation
    assert again.node_groups == cluster.node_groups
    # operator's keys only: what was left to defaults stays unset
    assert "rollout" not in node_doc or node_doc["rollout"] == doc.get("rollout")


def test_health_check_needs_a_source_for_gpuctl() -> None:
    doc = _enabled(starter("hgx-h100", 4))
    del doc["package_sources"]["gpuctl_wheelhouse"]
    with pytest.raises(ConfigError, match=r"slurm\.health_check\.enabled: the nodes install"):
        _load(doc)
    assert _load(_enabled(starter("hgx-h100", 4), pypi_index="https://pypi.example.com/simple"))


def test_slurm_extra_may_set_a_health_check_only_while_gpuctls_is_off() -> None:
    doc = yaml.safe_load(starter("hgx-h100", 4))
    doc["slurm"]["extra"] = {"HealthCheckProgram": "/usr/sbin/nhc", "HealthCheckInterval": 300}
    conf = render_files(_load(doc))["slurm/slurm.conf"]
    assert "HealthCheckProgram=/usr/sbin/nhc" in conf
    doc = _enabled(starter("hgx-h100", 4))
    doc["slurm"]["extra"] = {"healthcheckprogram": "/usr/sbin/nhc"}
    with pytest.raises(ConfigError, match=r"written from slurm\.health_check, which is enabled"):
        _load(doc)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("interval_s", 5, "greater than or equal to 10"),
        ("level", "standard", "'standard' is not allowed; expected 'quick'"),
        ("node_state", ["BUSY"], "node_state[0]: 'BUSY' is not allowed"),
        ("node_state", [], "at least 1 item"),
    ],
)
def test_health_check_fields_are_checked(field: str, value: Any, fragment: str) -> None:
    doc = _enabled(starter("hgx-h100", 4))
    doc["slurm"]["health_check"][field] = value
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        _load(doc)


def test_the_wheelhouse_is_an_absolute_path() -> None:
    with pytest.raises(ConfigError, match="gpuctl_wheelhouse"):
        _load(_enabled(starter("hgx-h100", 4), gpuctl_wheelhouse="wheelhouse"))


# ------------------------------------------------------------------------------------------
# The role


def _role_yaml(rel: str) -> Any:
    return yaml.safe_load((ROLE / rel).read_text(encoding="utf-8"))


def test_the_role_agrees_with_render_and_node_check() -> None:
    defaults = _role_yaml("defaults/main.yml")
    internal = _role_yaml("vars/main.yml")
    assert defaults["gpuctl_node_check_program"] == HEALTH_CHECK_PROGRAM
    assert internal["__gpuctl_node_check_cluster"] == str(DEFAULT_CLUSTER)
    # every variable render gives the role is one of its inputs
    rendered = yaml.safe_load(
        render_files(_load(_enabled(starter("hgx-h100", 4))))["group_vars/all.yml"]
    )
    ours = {k for k in rendered if k.startswith("gpuctl_node_check_")}
    assert ours <= set(defaults), ours - set(defaults)
    # slurmd kills a HealthCheckProgram after 60 s: the probes (deadline, then SIGKILL for a
    # tool that ignores SIGTERM) and the two scontrol calls fit within it
    worst = defaults["gpuctl_node_check_deadline_s"] + KILL_AFTER_S + 2 * SCONTROL_TIMEOUT_S
    assert worst < 60


def test_site_yml_installs_node_check_before_slurm() -> None:
    site = _role_yaml("../../site.yml")
    names = [p["ansible.builtin.import_playbook"] for p in site]
    assert names.index("gpuctl_node_check.yml") < names.index("slurm.yml")
    play = yaml.safe_load((ROOT / "playbooks" / "gpuctl_node_check.yml").read_text())
    assert play[0]["hosts"] == "role_compute"


def test_the_wrapper_passes_the_node_name_and_its_options_through() -> None:
    text = (ROLE / "templates" / "gpuctl-node-check.sh.j2").read_text()
    assert text.startswith("#!/bin/sh\n{{ ansible_managed | comment }}\n")
    line = next(ln for ln in text.splitlines() if ln.startswith("exec "))
    assert "--node {{ inventory_hostname }}" in line
    assert "--deadline {{ gpuctl_node_check_deadline_s }}" in line
    assert line.endswith('"$@"')


# ------------------------------------------------------------------------------------------
# The hash-locked requirements of the nodes' virtualenv


def test_requirements_are_the_locks_versions_and_hashes() -> None:
    lock = wheelhouse.LOCK.read_text(encoding="utf-8")
    assert wheelhouse.REQUIREMENTS.read_text(encoding="utf-8") == wheelhouse.node_requirements(
        lock
    ), "regenerate: python -c 'from gpuctl.provision import wheelhouse as w; "
    "w.REQUIREMENTS.write_text(w.node_requirements(w.LOCK.read_text()))'"
    text = wheelhouse.REQUIREMENTS.read_text(encoding="utf-8")
    pins = re.findall(r"(?m)^([a-z0-9-]+)==(\S+) \\$", text)
    assert sorted(n for n, _ in pins) == sorted(wheelhouse.NODE_PACKAGES)
    for name, version in pins:
        assert md.version(name) == version, name  # what the tests run with, too
        block = text.split(f"{name}=={version} \\\n", 1)[1].split("\n", 1)[0]
        assert block.strip().startswith("--hash=sha256:"), name


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_requirements_hold_every_dependency_of_what_they_list() -> None:
    env = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux"}
    listed = set(wheelhouse.NODE_PACKAGES)
    for name in wheelhouse.NODE_PACKAGES:
        for spec in md.requires(name) or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            assert _norm(req.name) in listed, f"{name} needs {req.name}"


def test_the_light_entry_point_needs_nothing_beyond_the_requirements() -> None:
    code = (
        "import sys, gpuctl.cli.nodecheck_main\n"
        "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    modules = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    dists = md.packages_distributions()
    site = {"_distutils_hack"}  # setuptools' .pth hook in this virtualenv, not an import of ours
    needed = {
        _norm(d)
        for m in modules
        if m not in sys.stdlib_module_names and m not in site
        for d in dists.get(m, [])
    }
    assert needed - {"gpuctl"} <= set(wheelhouse.NODE_PACKAGES), needed


# ------------------------------------------------------------------------------------------
# The wheelhouse builder (pip faked: what it is asked, and when)


def test_the_wheelhouse_is_rebuilt_only_for_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "src"
    for rel in ("pyproject.toml", "README.md", "gpuctl/__init__.py", "templates/t.j2"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    req = root / wheelhouse.REQUIREMENTS.relative_to(wheelhouse.SOURCE_ROOT)
    req.parent.mkdir(parents=True)
    req.write_text("typer==0.29.2 \\\n    --hash=sha256:00\n")
    (root / "playbooks" / "site.yml").write_text("---\n")
    calls: list[tuple[str, ...]] = []

    def fake_pip(*args: str) -> None:
        calls.append(args)
        out = Path(args[args.index("--dest" if args[0] == "download" else "--wheel-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        name = (
            "typer-0.29.2-py3-none-any.whl"
            if args[0] == "download"
            else "gpuctl-0.1.0-py3-none-any.whl"
        )
        (out / name).write_text(str(len(calls)))

    monkeypatch.setattr(wheelhouse, "_pip", fake_pip)
    dest = tmp_path / "lab" / "wheelhouse"
    assert wheelhouse.build(dest, root) is True
    assert [c[0] for c in calls] == ["download", "wheel"]
    assert "--require-hashes" in calls[0]
    assert "--only-binary=:all:" in calls[0]
    assert "--no-deps" in calls[1]
    assert sorted(p.name for p in dest.iterdir()) == [
        "SHA256SUMS",
        "gpuctl-0.1.0-py3-none-any.whl",
        "typer-0.29.2-py3-none-any.whl",
    ]
    sums = (dest / "SHA256SUMS").read_text().splitlines()
    assert sums[0].endswith("  gpuctl-0.1.0-py3-none-any.whl")
    assert re.fullmatch(r"[0-9a-f]{64}  typer-0\.29\.2-py3-none-any\.whl", sums[1])
    assert (tmp_path / "lab" / "wheelhouse.stamp").is_file()  # beside it, not copied to nodes
    assert wheelhouse.build(dest, root) is False
    (root / "gpuctl" / "__init__.py").write_text("changed")
    assert wheelhouse.build(dest, root) is True
    assert [c[0] for c in calls] == ["download", "wheel", "wheel"]  # only gpuctl again
    assert (dest / "gpuctl-0.1.0-py3-none-any.whl").read_text() == "3"
    req.write_text("typer==0.29.2 \\\n    --hash=sha256:01\n")
    assert wheelhouse.build(dest, root) is True
    # the requirements are in the role, which the gpuctl wheel carries too: both again
    assert [c[0] for c in calls][3:] == ["download", "wheel"]
