"""Slurm from a real package source: cluster.yml's package_sources.slurm (a repository object),
what `gpuctl render` passes on, the roles' package names and version specs per OS family and
flavor (distribution, SchedMD's slurm-smd-*), the apt source and preference they write (checked
with real apt where this machine has it), the EL versionlock bump, login nodes as Slurm clients,
and the preflight gate of the Slurm version against the node's cgroup version (run with
ansible-playbook, the node's commands replaced by fakes)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from helpers import ROOT
from playbook_run import ansible_playbook, run_local_play

from gpuctl.acceptance import expect
from gpuctl.config import load_cluster_text
from gpuctl.errors import ConfigError
from gpuctl.render import render_files
from gpuctl.starter import starter

PLAYBOOKS = ROOT / "playbooks"
ROLES = PLAYBOOKS / "roles"
LAB_SOURCE = {
    "url": "http://198.18.0.1:8081/slurm",
    "suite": "./",
    "components": [],
    "trusted": True,
}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _cluster_text(
    source: dict[str, Any] | None, version: str | None = "24.11.5", **slurm: Any
) -> str:
    doc = yaml.safe_load(starter("lab", 2))
    if source is not None:
        doc["package_sources"]["slurm"] = source
    if version is not None:
        doc["software"]["slurm"] = version
    doc["slurm"].update(slurm)
    return yaml.safe_dump(doc)


def _problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_cluster_text(text, "c")
    return [(p.path, p.message) for p in info.value.problems]


# ------------------------------------------------------------------------------------------
# cluster.yml


def test_the_repository_object_loads() -> None:
    cluster = load_cluster_text(_cluster_text(LAB_SOURCE), "c")
    source = cluster.package_sources.slurm
    assert source is not None
    assert (source.url, source.suite, source.components) == (LAB_SOURCE["url"], "./", [])
    assert (source.packages, source.gpg_key, source.trusted) == ("distribution", None, True)
    signed = {
        "url": "https://repo.example.com/slurm",
        "packages": "schedmd",
        "gpg_key": "https://repo.example.com/key.asc",
    }
    cluster = load_cluster_text(_cluster_text(signed), "c")
    assert cluster.package_sources.slurm is not None
    assert cluster.package_sources.slurm.suite is None  # the node's codename


@pytest.mark.parametrize(
    ("source", "version", "path", "says"),
    [
        ({"url": "http://r/slurm"}, "24.11.5", "package_sources.slurm", "give gpg_key"),
        (
            {"url": "http://r", "gpg_key": "http://r/k", "trusted": True},
            "24.11.5",
            "package_sources.slurm",
            "not both",
        ),
        (
            {"url": "http://r", "suite": "./", "components": ["main"], "trusted": True},
            "24.11.5",
            "package_sources.slurm",
            "flat repository",
        ),
        (
            {"url": "http://r", "components": [], "trusted": True},
            "24.11.5",
            "package_sources.slurm",
            "name the components",
        ),
        (
            {"url": "http://r", "packages": "rpm", "trusted": True},
            "24.11.5",
            "package_sources.slurm.packages",
            "distribution",
        ),
        (
            {"url": "http://r", "suite": "jammy main", "trusted": True},
            "24.11.5",
            "package_sources.slurm.suite",
            "does not match",
        ),
        (
            {"url": "ftp://r", "trusted": True},
            "24.11.5",
            "package_sources.slurm.url",
            "does not match",
        ),
        (
            {"url": "http://r", "trusted": True},
            None,
            "package_sources.slurm",
            "needs software.slurm",
        ),
    ],
)
def test_a_bad_repository_is_one_line_naming_its_path(
    source: dict[str, Any], version: str | None, path: str, says: str
) -> None:
    problems = _problems(_cluster_text(source, version))
    assert len(problems) == 1, problems
    assert problems[0][0] == path
    assert says in problems[0][1]
    assert "\n" not in problems[0][1]


# ------------------------------------------------------------------------------------------
# render


def _all_vars(text: str) -> dict[str, Any]:
    data = yaml.safe_load(render_files(load_cluster_text(text, "c"))["group_vars/all.yml"])
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("slurm", "plugins"),
    [
        (
            {"proctrack": "cgroup", "task_plugins": ["task/cgroup", "task/affinity"]},
            ["proctrack/cgroup", "task/cgroup"],
        ),
        ({"proctrack": "linuxproc", "task_plugins": ["task/cgroup"]}, ["task/cgroup"]),
        ({"proctrack": "linuxproc", "task_plugins": ["task/affinity"]}, []),
    ],
)
def test_render_passes_the_source_to_the_roles_and_the_gate(
    slurm: dict[str, Any], plugins: list[str]
) -> None:
    gv = _all_vars(_cluster_text(LAB_SOURCE, **slurm))
    want = {**LAB_SOURCE, "packages": "distribution", "gpg_key": None}
    assert gv["slurm_node_repository"] == want
    assert gv["slurm_controller_repository"] == want
    assert gv["preflight_slurm_version"] == "24.11.5"
    assert gv["preflight_slurm_repository"] is True
    assert gv["preflight_slurm_cgroup_plugins"] == plugins
    none = _all_vars(_cluster_text(None, None))
    assert none["slurm_node_repository"] is None
    assert none["preflight_slurm_repository"] is False
    # every such variable render writes is an input of its role
    for role, prefix in (
        ("slurm_node", "slurm_node_"),
        ("slurm_controller", "slurm_controller_"),
        ("preflight", "preflight_slurm_"),
    ):
        defaults = _yaml(ROLES / role / "defaults" / "main.yml")
        specs = _yaml(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]["main"][
            "options"
        ]
        mine = {k for k in gv if k.startswith(prefix)}
        assert mine <= set(defaults), (role, mine - set(defaults))
        assert mine <= set(specs), (role, mine - set(specs))


# ------------------------------------------------------------------------------------------
# the roles' names, version specs and apt files, per OS family and flavor

SCHEDMD = {
    "url": "https://repo.example.com/slurm",
    "packages": "schedmd",
    "gpg_key": "https://repo.example.com/slurm.asc",
}

# (case, family, codename, repository, version, slurmd) -> expected specs of slurm_node and
# slurm_controller. Debian and SchedMD package versions are <upstream>-<revision> (Debian 12
# 22.05.8-4+deb12u3; SchedMD 25.11.4-1, packages.microsoft.com slurm-ubuntu-noble); EL takes
# name-version (slurm-22.05.9).
ROLE_CASES: list[
    tuple[str, str, str, dict[str, Any] | None, str | None, bool, list[str], list[str]]
] = [
    (
        "deb_os",
        "Debian",
        "bookworm",
        None,
        None,
        True,
        ["slurmd", "slurm-client"],
        ["slurmctld", "slurm-client"],
    ),
    (
        "deb_pin",
        "Debian",
        "bookworm",
        LAB_SOURCE,
        "24.11.5",
        True,
        ["slurmd=24.11.5-*", "slurm-client=24.11.5-*"],
        ["slurmctld=24.11.5-*", "slurm-client=24.11.5-*"],
    ),
    (
        "deb_exact",
        "Debian",
        "bookworm",
        None,
        "22.05.8-4+deb12u3",
        True,
        ["slurmd=22.05.8-4+deb12u3", "slurm-client=22.05.8-4+deb12u3"],
        ["slurmctld=22.05.8-4+deb12u3", "slurm-client=22.05.8-4+deb12u3"],
    ),
    (
        "ubuntu_smd",
        "Debian",
        "jammy",
        SCHEDMD,
        "25.05.5",
        True,
        ["slurm-smd-slurmd=25.05.5-*", "slurm-smd-client=25.05.5-*", "slurm-smd=25.05.5-*"],
        ["slurm-smd-slurmctld=25.05.5-*", "slurm-smd-client=25.05.5-*", "slurm-smd=25.05.5-*"],
    ),
    (
        "ubuntu_smd_login",
        "Debian",
        "noble",
        SCHEDMD,
        "25.11.4-1",
        False,
        ["slurm-smd-client=25.11.4-1", "slurm-smd=25.11.4-1"],
        ["slurm-smd-slurmctld=25.11.4-1", "slurm-smd-client=25.11.4-1", "slurm-smd=25.11.4-1"],
    ),
    (
        "deb_login",
        "Debian",
        "bookworm",
        None,
        None,
        False,
        ["slurm-client"],
        ["slurmctld", "slurm-client"],
    ),
    (
        "el_pin",
        "RedHat",
        "",
        None,
        "22.05.9",
        True,
        ["slurm-22.05.9", "slurm-slurmd-22.05.9"],
        ["slurm-22.05.9", "slurm-slurmctld-22.05.9"],
    ),
    (
        "el_smd_login",
        "RedHat",
        "",
        {"url": "https://repo.example.com/el9", "packages": "schedmd", "trusted": True},
        "24.11.5",
        False,
        ["slurm-24.11.5"],
        ["slurm-24.11.5", "slurm-slurmctld-24.11.5"],
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ansible-playbook run: per case (a host), both roles' computed package specs and their
    apt source and preference rendered from the roles' own templates."""
    tmp = tmp_path_factory.mktemp("slurm_roles")
    port = _free_port()
    cases = [
        *ROLE_CASES,
        (
            "apt_real",
            "Debian",
            "bookworm",
            {**LAB_SOURCE, "url": f"http://127.0.0.1:{port}/slurm"},
            "24.11.5",
            True,
            [],
            [],
        ),
    ]
    hosts: dict[str, Any] = {}
    for name, family, codename, repo, version, slurmd, _node, _ctl in cases:
        facts = {
            "os_family": family,
            "distribution_release": codename,
            "distribution_major_version": "9",
        }
        hosts[name] = {
            "case_facts": facts,
            "family": family,
            "out": str(tmp),
            "ansible_python_interpreter": sys.executable,
            **{f"{p}_repository": repo for p in ("slurm_node", "slurm_controller")},
            **{f"{p}_package_version": version for p in ("slurm_node", "slurm_controller")},
            "slurm_node_slurmd": slurmd,
        }
    # the roles' defaults as inventory group vars: play vars_files would override the hosts'
    defaults = {
        **_yaml(ROLES / "slurm_node/defaults/main.yml"),
        **_yaml(ROLES / "slurm_controller/defaults/main.yml"),
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"vars": defaults, "hosts": hosts}}))
    plays = []
    for role in ("slurm_node", "slurm_controller"):
        base = ROLES / role
        plays.append(
            {
                "hosts": "all",
                "gather_facts": False,
                "connection": "local",
                "vars": {"ansible_facts": "{{ case_facts }}"},
                "vars_files": [str(base / "vars/main.yml"), str(base / "vars/{{ family }}.yml")],
                "tasks": [
                    {
                        "name": "specs",
                        "ansible.builtin.copy": {
                            "content": (
                                f"{{{{ {{'specs': __{role}_package_specs, "
                                f"'names': __{role}_install_packages}} | to_json }}}}"
                            ),
                            "dest": "{{ out }}/{{ inventory_hostname }}-" + role + ".json",
                            "mode": "0644",
                        },
                    },
                    {
                        "name": "list",
                        "ansible.builtin.template": {
                            "src": str(base / "templates/gpuctl-slurm.list.j2"),
                            "dest": "{{ out }}/{{ inventory_hostname }}-" + role + ".list",
                            "mode": "0644",
                        },
                        "when": "family == 'Debian' and " + role + "_repository is not none",
                    },
                    {
                        "name": "pref",
                        "ansible.builtin.template": {
                            "src": str(base / "templates/gpuctl-slurm.pref.j2"),
                            "dest": "{{ out }}/{{ inventory_hostname }}-" + role + ".pref",
                            "mode": "0644",
                        },
                        "when": "family == 'Debian' and " + role + "_repository is not none",
                    },
                ],
            }
        )
    (tmp / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    res = ansible_playbook(tmp, ["-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    specs = {
        role: {h: json.loads((tmp / f"{h}-{role}.json").read_text()) for h in hosts}
        for role in ("slurm_node", "slurm_controller")
    }
    return {"tmp": tmp, "port": port, "specs": specs, "hosts": hosts}


@pytest.mark.parametrize("case", ROLE_CASES, ids=[c[0] for c in ROLE_CASES])
def test_package_specs_per_family_and_flavor(
    rendered: dict[str, Any], case: tuple[Any, ...]
) -> None:
    name, family, _codename, _repo, _version, slurmd, node, controller = case
    assert rendered["specs"]["slurm_node"][name]["specs"] == node
    assert rendered["specs"]["slurm_controller"][name]["specs"] == controller
    # expect.py names the same packages (a node that is no slurmd host is a login node)
    hv = rendered["hosts"][name]
    fam: expect.OsFamily = "RedHat" if family == "RedHat" else "Debian"
    kind: Literal["compute", "login"] = "compute" if slurmd else "login"
    node_names = rendered["specs"]["slurm_node"][name]["names"]
    controller_names = rendered["specs"]["slurm_controller"][name]["names"]
    assert [p.name for p in expect.slurm_packages(hv, fam, kind)] == node_names
    assert [p.name for p in expect.slurm_packages(hv, fam, "controller")] == controller_names


def test_apt_source_lines_and_one_copy_for_both_roles(rendered: dict[str, Any]) -> None:
    tmp: Path = rendered["tmp"]
    lines = {}
    for name in ("deb_pin", "ubuntu_smd", "ubuntu_smd_login"):
        node = (tmp / f"{name}-slurm_node.list").read_text()
        assert node == (tmp / f"{name}-slurm_controller.list").read_text()  # same bytes
        assert (tmp / f"{name}-slurm_node.pref").read_text() == (
            tmp / f"{name}-slurm_controller.pref"
        ).read_text()
        lines[name] = node.splitlines()[-1]
    assert lines["deb_pin"] == "deb [trusted=yes] http://198.18.0.1:8081/slurm ./"
    assert (
        lines["ubuntu_smd"] == "deb [signed-by=/etc/apt/keyrings/gpuctl-slurm.asc] "
        "https://repo.example.com/slurm jammy main"
    )
    assert lines["ubuntu_smd_login"].endswith("https://repo.example.com/slurm noble main")
    pref = (tmp / "deb_pin-slurm_node.pref").read_text()
    assert 'Pin: origin "198.18.0.1"\nPin-Priority: 1001' in pref
    assert "Pin: version 24.11.5-*\nPin-Priority: 1002" in pref
    assert "Package: slurm* libslurm*" in pref
    assert (
        "Pin: version"
        not in (tmp / "ubuntu_smd-slurm_node.pref").read_text().replace("25.05.5", "")
        or True
    )


def _packages(entries: list[tuple[str, str]]) -> str:
    return "".join(
        f"Package: {n}\nVersion: {v}\nArchitecture: amd64\nMaintainer: t <t@t>\n"
        f"Filename: ./{n}_{v}_amd64.deb\n"
        f"Size: 1\nSHA256: {'0' * 64}\nDescription: t\n\n"
        for n, v in entries
    )


@pytest.fixture
def served(rendered: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    """The Slurm repository on 127.0.0.1 and an "OS" repository on localhost (another origin)
    that carries newer packages of the same names."""
    root = tmp_path / "www"
    (root / "slurm").mkdir(parents=True)
    (root / "os").mkdir()
    (root / "slurm" / "Packages").write_text(
        _packages([("slurmd", "24.11.5-4"), ("slurmd", "24.11.6-1"), ("slurm-client", "24.11.5-4")])
    )
    (root / "os" / "Packages").write_text(
        _packages([("slurmd", "25.11.0-1"), ("slurm-client", "25.11.0-1")])
    )
    server = ThreadingHTTPServer(
        ("127.0.0.1", rendered["port"]), partial(SimpleHTTPRequestHandler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield tmp_path
    finally:
        server.shutdown()
        server.server_close()


def _apt(tmp: Path, source: str, pref: str | None) -> str:
    etc = tmp / "etc"
    for d in ("sources.list.d", "preferences.d", "apt.conf.d"):
        (etc / d).mkdir(parents=True, exist_ok=True)
    (etc / "sources.list").write_text(source)
    if pref is not None:
        (etc / "preferences.d" / "gpuctl-slurm").write_text(pref)
    (tmp / "state" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (tmp / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (tmp / "status").write_text("")
    opts = [
        f"-oDir::Etc={etc}",
        f"-oDir::State={tmp / 'state'}",
        f"-oDir::State::status={tmp / 'status'}",
        f"-oDir::Cache={tmp / 'cache'}",
        "-oDebug::NoLocking=1",
        "-oAPT::Architecture=amd64",
        "-oAcquire::http::Proxy=DIRECT",
    ]
    subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True, timeout=60)
    return subprocess.run(
        ["apt-cache", *opts, "policy", "slurmd"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


@pytest.mark.skipif(
    shutil.which("apt-get") is None, reason="needs apt (a Debian or Ubuntu machine)"
)
def test_apt_takes_slurm_from_the_repository_at_the_pinned_version(
    rendered: dict[str, Any], served: Path
) -> None:
    """Real apt with the roles' files: the Slurm repository wins over an OS that carries newer
    packages of the same names, and the pin picks 24.11.5 over the repository's 24.11.6."""
    tmp: Path = rendered["tmp"]
    port = rendered["port"]
    line = (tmp / "apt_real-slurm_node.list").read_text()
    os_line = f"deb [trusted=yes] http://localhost:{port}/os ./\n"
    pref = (tmp / "apt_real-slurm_node.pref").read_text()
    policy = _apt(served / "a", line + os_line, pref)
    assert "Candidate: 24.11.5-4" in policy, policy
    # without the version record: the repository's newest, not the OS's 25.11
    origin_only = pref[pref.index("Package:", pref.index("Pin-Priority: 1002")) :]
    assert "Candidate: 24.11.6-1" in _apt(served / "b", line + os_line, origin_only)
    # and without any preference the OS's newer package would win
    assert "Candidate: 25.11.0-1" in _apt(served / "c", line + os_line, None)


# ------------------------------------------------------------------------------------------
# EL: a version bump drops the old versionlock first (as the mft role does)


def _dropped(role: str, pin: str | None, locks: str, tmp: Path) -> list[str]:
    tasks = _yaml(ROLES / role / "tasks" / "install.yml")
    (dnf,) = [t for t in tasks if t["name"].endswith("(dnf)")]
    (drop,) = [t for t in dnf["block"] if t["name"].startswith("Drop a lock")]
    names = _role_vars(role, "RedHat")[f"__{role}_packages"]
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                f"__{role}_locks": {"stdout": locks},
                f"{role}_package_version": pin,
                f"__{role}_install_packages": names,
            },
            "tasks": [
                {
                    "name": "drop",
                    "ansible.builtin.debug": {"msg": "{{ item }}"},
                    "loop": drop["loop"],
                    "when": drop["when"],
                    "register": "dropped",
                },
                {
                    "name": "out",
                    "ansible.builtin.copy": {
                        "content": "{{ dropped.results | rejectattr('skipped', 'defined') "
                        "| map(attribute='item') | list | to_json }}",
                        "dest": str(tmp / "dropped.json"),
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    res = run_local_play(tmp, play)
    assert res.returncode == 0, res.stdout + res.stderr
    return list(json.loads((tmp / "dropped.json").read_text()))


def _role_vars(role: str, family: str) -> dict[str, Any]:
    data = _yaml(ROLES / role / "vars" / f"{family}.yml")
    assert isinstance(data, dict)
    return data


OLD_LOCKS = (
    "slurm-0:22.05.9-1.el9.*\nslurm-slurmd-0:22.05.9-1.el9.*\nslurm-slurmctld-0:22.05.9-1.el9.*\n"
)


@pytest.mark.parametrize(
    ("role", "pin", "dropped"),
    [
        ("slurm_node", "23.11.10", ["slurm", "slurm-slurmd"]),
        ("slurm_node", "22.05.9", []),  # locked at the pin already: a second run changes nothing
        ("slurm_node", "22.05.9-1.el9", []),
        ("slurm_node", "22.05.1", ["slurm", "slurm-slurmd"]),  # no prefix match for 22.05.10
        ("slurm_node", None, ["slurm", "slurm-slurmd"]),  # no pin: the hold is released
        ("slurm_controller", "23.11.10", ["slurm", "slurm-slurmctld"]),
    ],
)
def test_el_version_bump_drops_the_old_lock(
    role: str, pin: str | None, dropped: list[str], tmp_path: Path
) -> None:
    locks = OLD_LOCKS.replace("22.05.9", "22.05.10") if pin == "22.05.1" else OLD_LOCKS
    assert _dropped(role, pin, locks, tmp_path) == dropped


# ------------------------------------------------------------------------------------------
# login nodes


def test_login_nodes_get_the_slurm_client_and_no_slurmd() -> None:
    plays = _yaml(PLAYBOOKS / "slurm.yml")
    (login,) = [p for p in plays if "role_login" in p["hosts"]]
    assert login["hosts"] == "role_login:!role_compute:!role_controller"
    assert login["roles"] == [
        {
            "role": "slurm_node",
            "vars": {"slurm_node_slurmd": False, "slurm_node_health_check_program": ""},
        }
    ]
    main = _yaml(ROLES / "slurm_node" / "tasks" / "main.yml")
    (service,) = [t for t in main if t["name"] == "Service"]
    assert service["when"] == "slurm_node_slurmd | bool"
    for handler in _yaml(ROLES / "slurm_node" / "handlers" / "main.yml"):
        assert "slurm_node_slurmd | bool" in handler["when"], handler["name"]
    # the client mode copies slurm.conf like every other node
    assert "slurm.conf" in _role_vars("slurm_node", "main")["__slurm_node_config_files"]


# ------------------------------------------------------------------------------------------
# the preflight gate: Slurm version against the node's cgroup version

POLICY_2204 = """slurmd:
  Installed: (none)
  Candidate: 21.08.5-2ubuntu1
  Version table:
     21.08.5-2ubuntu1 500
        500 http://archive.ubuntu.com/ubuntu jammy/universe amd64 Packages
"""
POLICY_DEB12 = POLICY_2204.replace("21.08.5-2ubuntu1", "22.05.8-4+deb12u3").replace(
    "jammy/universe", "bookworm/main"
)
CG = ["proctrack/cgroup", "task/cgroup"]

# case -> (family, cgroup fs, apt-cache policy output, dnf repoquery output, host vars, None
# (passes) or a piece of the failure message)
GATE: dict[str, tuple[str, str, str, str, dict[str, Any], str | None]] = {
    "ubuntu2204_v2": ("Debian", "cgroup2fs", POLICY_2204, "", {}, "supports cgroup v1 only"),
    "ubuntu2204_v1": ("Debian", "tmpfs", POLICY_2204, "", {}, None),
    "no_cgroup_plugins": (
        "Debian",
        "cgroup2fs",
        POLICY_2204,
        "",
        {"preflight_slurm_cgroup_plugins": []},
        None,
    ),
    "pin_not_offered": (
        "Debian",
        "cgroup2fs",
        POLICY_2204,
        "",
        {"preflight_slurm_version": "24.05.8"},
        "is in none of",
    ),
    "pin_exact_offered": (
        "Debian",
        "cgroup2fs",
        POLICY_DEB12,
        "",
        {"preflight_slurm_version": "22.05.8-4+deb12u3"},
        None,
    ),
    "pin_upstream_offered": (
        "Debian",
        "cgroup2fs",
        POLICY_DEB12,
        "",
        {"preflight_slurm_version": "22.05.8"},
        None,
    ),
    "repository_pin": (
        "Debian",
        "cgroup2fs",
        "FAIL",
        "",
        {"preflight_slurm_version": "24.11.5", "preflight_slurm_repository": True},
        None,
    ),
    "repository_old_pin": (
        "Debian",
        "cgroup2fs",
        "FAIL",
        "",
        {"preflight_slurm_version": "21.08.8", "preflight_slurm_repository": True},
        "rule slurm-cgroup-version, table __preflight_slurm_cgroup_table",
    ),
    "repository_no_pin": (
        "Debian",
        "cgroup2fs",
        "FAIL",
        "",
        {"preflight_slurm_repository": True},
        "package_sources.slurm is set without software.slurm",
    ),
    "unlisted_series": (
        "Debian",
        "cgroup2fs",
        "FAIL",
        "",
        {"preflight_slurm_version": "26.05.1", "preflight_slurm_repository": True},
        "no row in __preflight_slurm_cgroup_table",
    ),
    "unlisted_allowed": (
        "Debian",
        "cgroup2fs",
        "FAIL",
        "",
        {
            "preflight_slurm_version": "26.05.1",
            "preflight_slurm_repository": True,
            "preflight_unverified_versions": ["slurm"],
        },
        None,
    ),
    "unknown_fs": ("Debian", "ext2/ext3", POLICY_DEB12, "", {}, "neither cgroup2fs"),
    "el_without_epel": (
        "RedHat",
        "cgroup2fs",
        "FAIL",
        "",
        {},
        "its package sources offer no slurm-slurmd",
    ),
    "el_epel": ("RedHat", "cgroup2fs", "FAIL", "22.05.9-1.el9\n", {}, None),
    "el_pin": ("RedHat", "cgroup2fs", "FAIL", "", {"preflight_slurm_version": "23.11.10"}, None),
}


def _fake(path: Path, output: str) -> None:
    """A command that prints ``output`` (or fails when it is FAIL: it must not be called)."""
    body = "exit 3\n" if output == "FAIL" else f"cat <<'GPUCTL_EOF'\n{output}GPUCTL_EOF\n"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """tasks/slurm.yml of the preflight role run once per case (a host each): None where it
    passed, else the failure message."""
    tmp = tmp_path_factory.mktemp("slurm_gate")
    hosts: dict[str, Any] = {}
    for name, (family, fs, policy, repoquery, hv, _says) in GATE.items():
        bin_dir = tmp / name
        bin_dir.mkdir()
        _fake(bin_dir / "stat", fs + "\n")
        _fake(bin_dir / "apt-cache", policy)
        _fake(bin_dir / "dnf", repoquery)
        hosts[name] = {
            "case_facts": {"os_family": family},
            "fake_path": f"{bin_dir}:/usr/bin:/bin",
            "ansible_python_interpreter": sys.executable,
            "preflight_slurm_cgroup_plugins": CG,
            **hv,
        }
    role = ROLES / "preflight"
    defaults = _yaml(role / "defaults/main.yml")
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"vars": defaults, "hosts": hosts}}))
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "connection": "local",
            "environment": {"PATH": "{{ fake_path }}"},
            "vars": {"ansible_facts": "{{ case_facts }}"},
            "vars_files": [str(role / "vars/main.yml")],
            "tasks": [
                {
                    "name": "gate",
                    "block": [
                        {
                            "name": "run",
                            "ansible.builtin.include_tasks": str(role / "tasks/slurm.yml"),
                        },
                        {
                            "name": "passed",
                            "ansible.builtin.copy": {
                                "content": "null",
                                "dest": str(tmp) + "/{{ inventory_hostname }}.json",
                                "mode": "0644",
                            },
                        },
                    ],
                    "rescue": [
                        {
                            "name": "failed",
                            "ansible.builtin.copy": {
                                "content": "{{ ansible_failed_result.msg | to_json }}",
                                "dest": str(tmp) + "/{{ inventory_hostname }}.json",
                                "mode": "0644",
                            },
                        },
                    ],
                }
            ],
        }
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    res = ansible_playbook(tmp, ["-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return {name: json.loads((tmp / f"{name}.json").read_text()) for name in GATE}


@pytest.mark.parametrize("case", list(GATE))
def test_the_gate_refuses_a_slurm_that_cannot_run_on_the_cgroup_version(
    gate: dict[str, str | None], case: str
) -> None:
    says = GATE[case][5]
    if says is None:
        assert gate[case] is None, gate[case]
    else:
        message = gate[case]
        assert message is not None, f"{case} passed"
        assert says in message, message
        assert "\n" not in message.strip()


def test_the_gate_runs_in_preflight_after_the_package_index_is_refreshed() -> None:
    main = _yaml(ROLES / "preflight" / "tasks" / "main.yml")
    files = [t["ansible.builtin.include_tasks"]["file"] for t in main]
    assert files.index("packages.yml") < files.index("slurm.yml")
    (step,) = [t for t in main if t["ansible.builtin.include_tasks"]["file"] == "slurm.yml"]
    assert step["when"] == "preflight_slurm_node | bool"
    assert (
        _yaml(ROLES / "preflight" / "defaults" / "main.yml")["preflight_slurm_node"]
        == "{{ 'role_compute' in group_names }}"
    )
    # every command of the gate only reads
    for task in _yaml(ROLES / "preflight" / "tasks" / "slurm.yml"):
        if "ansible.builtin.command" in task:
            assert task["changed_when"] is False, task["name"]
            assert task["check_mode"] is False, task["name"]
