"""The NVIDIA driver and DOCA-OFED in the order and lifecycle a real node needs (issue 15).

What the Debian lab cannot show (DOCA, DKMS, Secure Boot, Ubuntu/EL package sets, kernel
updates) is checked here: the roles' variables evaluated per OS family with Ansible's own
templating, their task files read, and the small task files run for real (ansible-playbook,
local connection) against stand-in files.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from helpers import ROOT
from playbook_run import ansible_playbook

PLAYBOOKS = ROOT / "playbooks"
ROLES = PLAYBOOKS / "roles"

DEBIAN12 = {
    "os_family": "Debian",
    "distribution": "Debian",
    "distribution_major_version": "12",
    "distribution_version": "12.5",
    "kernel": "6.1.0-18-amd64",
    "architecture": "x86_64",
}
UBUNTU2204 = {
    "os_family": "Debian",
    "distribution": "Ubuntu",
    "distribution_major_version": "22",
    "distribution_version": "22.04",
    "kernel": "6.5.0-41-generic",
    "architecture": "x86_64",
}
ROCKY94 = {
    "os_family": "RedHat",
    "distribution": "Rocky",
    "distribution_major_version": "9",
    "distribution_version": "9.4",
    "kernel": "5.14.0-427.13.1.el9_4.x86_64",
    "architecture": "x86_64",
}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _trusted(value: Any) -> Any:
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


def _role_value(
    role: str, vars_files: list[str], facts: dict[str, str], name: str, **extra: Any
) -> Any:
    """``name`` as the role sees it: defaults, vars/main.yml, the OS vars file, ``extra``."""
    variables: dict[str, Any] = {}
    variables.update(_trusted(_yaml(ROLES / role / "defaults" / "main.yml")))
    for f in ["main", *vars_files]:
        variables.update(_trusted(_yaml(ROLES / role / "vars" / f"{f}.yml")))
    variables.update(_trusted(extra))
    variables["ansible_facts"] = facts
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template("{{ " + name + " }}"))


def _tasks(role: str, file: str) -> list[dict[str, Any]]:
    """The tasks of a task file, blocks flattened."""
    out: list[dict[str, Any]] = []

    def walk(items: list[dict[str, Any]]) -> None:
        for t in items:
            out.append(t)
            walk(t.get("block", []))

    walk(_yaml(ROLES / role / "tasks" / file))
    return out


def _named(tasks: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [t for t in tasks if t.get("name") == name]
    assert len(found) == 1, (name, [t.get("name") for t in tasks])
    return found[0]


# the pin-and-hold recipe the roles share: the internal pinned_packages role, its task names
PINNED = "pinned_packages"
DROP_LOCK = "Drop a lock on another version: {{ pinned_packages_label }}"
DNF_INSTALL = "At the pinned version (dnf): {{ pinned_packages_label }}"
APT_INSTALL = "At the pinned version (apt): {{ pinned_packages_label }}"
HOLD = "Hold the packages (apt): {{ pinned_packages_label }}"


def _pinned(role: str, file: str, name: str, tasks_from: str | None = None) -> dict[str, Any]:
    """The vars task ``name`` of a role passes to the pinned_packages role it includes."""
    task = _named(_tasks(role, file), name)
    include = task["ansible.builtin.include_role"]
    assert include["name"] == PINNED
    assert include.get("tasks_from") == tasks_from
    return dict(task["vars"])


# ------------------------------------------------------------------------------------------
# 1. DOCA-OFED before the driver, and what a DOCA change does afterwards


def test_site_installs_the_rdma_stack_before_the_driver_and_peermem_after_it() -> None:
    site = [p["ansible.builtin.import_playbook"] for p in _yaml(PLAYBOOKS / "site.yml")]
    assert site.index("rdma.yml") < site.index("nvidia_driver.yml") < site.index("rdma_peermem.yml")
    # the peermem play runs the rdma role's peermem tasks on their own
    play = _yaml(PLAYBOOKS / "rdma_peermem.yml")[0]
    assert play["hosts"] == "rdma"
    role = play["tasks"][0]["ansible.builtin.import_role"]
    assert role == {"name": "rdma", "tasks_from": "peermem.yml"}


def test_peermem_waits_for_the_driver_instead_of_failing() -> None:
    tasks = _tasks("rdma", "peermem.yml")
    load = _named(tasks, "Load nvidia-peermem")
    assert "__rdma_peermem_present.rc | default(1) == 0" in load["when"]
    probe = _named(tasks, "Look for the nvidia-peermem module")
    assert probe["ansible.builtin.command"]["argv"][:2] == ["modprobe", "--dry-run"]


def test_a_doca_change_rebuilds_the_driver_modules_then_restarts_openibd_now() -> None:
    tasks = _tasks("rdma", "install.yml")
    want = ["rdma : Rebuild the NVIDIA driver's DKMS modules", "rdma : Restart openibd"]
    assert _named(tasks, "DOCA-OFED packages at the pinned version (apt)")["notify"] == want
    dnf = _pinned(
        "rdma", "install.yml", "DOCA-OFED packages at the pinned version (dnf)", "dnf.yml"
    )
    assert dnf["pinned_packages_notify"] == want
    assert (
        _named(_tasks(PINNED, "dnf.yml"), DNF_INSTALL)["notify"] == "{{ pinned_packages_notify }}"
    )
    # flushed inside the role: the next role (the driver, peermem, IPoIB) finds the new stack
    assert tasks[-1].get("ansible.builtin.meta") == "flush_handlers"
    handlers = _yaml(ROLES / "rdma" / "handlers" / "main.yml")
    order = [h["name"] for h in handlers]
    assert order.index("Rebuild the NVIDIA driver's DKMS modules") < order.index("Restart openibd")
    for h in handlers:
        if h.get("listen") in want:
            assert h["when"] == "not __rdma_in_container", h["name"]
    rebuild = next(h for h in handlers if h["name"] == "Rebuild the NVIDIA driver's DKMS modules")
    assert rebuild["ansible.builtin.command"]["argv"][:3] == ["dkms", "install", "--force"]


@pytest.mark.parametrize(
    ("status", "want"),
    [
        # dkms 3 (Ubuntu 24.04, EL 9 EPEL)
        (
            "nvidia/570.172.08, 6.8.0-45-generic, x86_64: installed\n"
            "mlnx-ofed-kernel/24.10.OFED.24.10.1.1.4.1, 6.8.0-45-generic, x86_64: installed\n",
            ["nvidia/570.172.08"],
        ),
        # dkms 2 (Ubuntu 22.04), EL's module name
        (
            "nvidia-open, 570.133.20, 5.15.0-105-generic, x86_64: installed\n",
            ["nvidia-open/570.133.20"],
        ),
        ("", []),
    ],
    ids=["dkms3", "dkms2", "no-driver-yet"],
)
def test_dkms_status_names_the_driver_modules_to_rebuild(status: str, want: list[str]) -> None:
    got = _role_value(
        "rdma",
        ["Debian"],
        DEBIAN12,
        "__rdma_dkms_modules",
        __rdma_dkms_status={"stdout_lines": status.splitlines()},
    )
    assert got == want


def test_a_new_doca_version_is_pinned_and_installed_through_the_hold() -> None:
    apt = _role_value(
        "rdma", ["Ubuntu-22"], UBUNTU2204, "__rdma_doca_apt_specs", rdma_doca_version="2.9.1"
    )
    dnf = _role_value(
        PINNED,
        [],
        ROCKY94,
        "__pinned_packages_specs",
        pinned_packages_names=_yaml(ROLES / "rdma" / "vars" / "main.yml")["__rdma_doca_packages"],
        pinned_packages_version="2.9.1",
    )
    # doca-ofed=2.9.5-0.1.8: the DOCA version and a build revision
    assert apt == ["doca-ofed=2.9.1-*"]
    assert dnf == ["doca-ofed-2.9.1"]
    tasks = _tasks("rdma", "install.yml")
    apt_task = _named(tasks, "DOCA-OFED packages at the pinned version (apt)")[
        "ansible.builtin.apt"
    ]
    assert apt_task["name"] == "{{ __rdma_doca_apt_specs }}"
    assert apt_task["allow_change_held_packages"] is True
    _pinned("rdma", "install.yml", "DOCA-OFED packages at the pinned version (dnf)", "dnf.yml")
    names = [t.get("name") for t in _tasks(PINNED, "dnf.yml")]
    # dnf: the lock on the old version goes before the install
    assert names.index(DROP_LOCK) < names.index(DNF_INSTALL)


@pytest.mark.parametrize(
    ("facts", "vars_file", "doca", "path"),
    [
        (UBUNTU2204, "Ubuntu-22", "2.9.1", "2.9.1/ubuntu22.04/x86_64/"),
        (
            {**UBUNTU2204, "distribution_version": "24.04"},
            "Ubuntu-24",
            "3.2.0",
            "3.2.0/ubuntu24.04/x86_64/",
        ),
        (ROCKY94, "RedHat", "2.9.3", "2.9.3/rhel9.4/x86_64/"),
        (ROCKY94, "RedHat", "3.2.0", "3.2.0/rhel9/x86_64/"),
        ({**ROCKY94, "architecture": "aarch64"}, "RedHat", "3.3.0", "3.3.0/rhel9/arm64-sbsa/"),
    ],
    ids=["ubuntu2204", "ubuntu2404", "rocky94-doca2", "rocky94-doca3.2", "rocky-arm"],
)
def test_doca_repository_path_follows_the_release(
    facts: dict[str, str], vars_file: str, doca: str, path: str
) -> None:
    # per Ubuntu release; EL per minor release up to DOCA 3.1, per major from 3.2 (DKMS)
    url = _role_value("rdma", [vars_file], facts, "__rdma_doca_url", rdma_doca_version=doca)
    assert url == "https://linux.mellanox.com/public/repo/doca/" + path


# ------------------------------------------------------------------------------------------
# 2. Persistence mode on Ubuntu

UBUNTU_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""
# NVIDIA's template (init/systemd/nvidia-persistenced.service.template), user filled in
NVIDIA_UNIT = """[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""


def _run_role_tasks(tmp: Path, tasks_from: str, extra: dict[str, Any]) -> Any:
    """The role's ``tasks_from`` file through include_role, internals overridden by extra vars."""
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {
                        "name": "nvidia_driver",
                        "tasks_from": tasks_from,
                    }
                }
            ],
        }
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play), encoding="utf-8")
    (tmp / "extra.json").write_text(
        json.dumps({"ansible_python_interpreter": sys.executable, **extra}), encoding="utf-8"
    )
    env = {
        "ANSIBLE_ROLES_PATH": str(ROLES),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    }
    return ansible_playbook(tmp, [str(tmp / "play.yml"), "-e", f"@{tmp / 'extra.json'}"], env)


@pytest.mark.parametrize(
    ("unit", "dropin"),
    [(UBUNTU_UNIT, True), (NVIDIA_UNIT, False)],
    ids=["ubuntu", "nvidia-template"],
)
def test_persistence_mode_drop_in_where_the_packaged_unit_disables_it(
    tmp_path: Path, unit: str, dropin: bool
) -> None:
    unit_file = tmp_path / "nvidia-persistenced.service"
    unit_file.write_text(unit, encoding="utf-8")
    target = tmp_path / "dropin" / "gpuctl-persistence-mode.conf"
    target.parent.mkdir()
    if not dropin:  # a drop-in left from before goes
        target.write_text("[Service]\n", encoding="utf-8")
    res = _run_role_tasks(
        tmp_path,
        "persistenced.yml",
        {
            "nvidia_driver_version": "570.172.08",
            # no service to restart here: the handler is skipped
            "nvidia_driver_persistenced": False,
            "__nvidia_driver_persistenced_unit_files": [
                str(tmp_path / "missing.service"),
                str(unit_file),
            ],
            "__nvidia_driver_persistenced_dropin": str(target),
        },
    )
    if dropin:
        if os.getuid() != 0:  # the role writes it owner root
            pytest.skip("the drop-in is written owner root: run as root")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        text = target.read_text(encoding="utf-8")
        assert (
            "[Service]\nExecStart=\nExecStart=/usr/bin/nvidia-persistenced"
            " --user nvidia-persistenced --persistence-mode --verbose\n" in text
        )
        assert "--no-persistence-mode --verbose\n#" not in text
    else:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert not target.exists()


def test_persistenced_drop_in_runs_before_the_service_starts() -> None:
    tasks = _tasks("nvidia_driver", "service.yml")
    names = [t.get("name") for t in tasks]
    assert names.index("Persistence mode in nvidia-persistenced's unit") < names.index(
        "Persistence daemon enabled and started"
    )
    handlers = _yaml(ROLES / "nvidia_driver" / "handlers" / "main.yml")
    restart = next(h for h in handlers if h["name"] == "Restart nvidia-persistenced")
    assert restart["ansible.builtin.systemd_service"]["daemon_reload"] is True


# ------------------------------------------------------------------------------------------
# 3. Kernel lifecycle


@pytest.mark.parametrize(
    ("facts", "vars_file", "kernels", "want"),
    [
        (
            DEBIAN12,
            "Debian",
            "linux-image-6.1.0-18-amd64 ii \nlinux-image-6.1.0-21-amd64 ii \n"
            "linux-image-amd64 ii \n"
            "linux-headers-amd64 un \nlinux-image-6.1.0-21-amd64-dbg un \n",
            ["linux-headers-6.1.0-18-amd64", "linux-headers-amd64"],
        ),
        (
            UBUNTU2204,
            "Ubuntu",
            "linux-generic-hwe-22.04 ii \nlinux-image-generic-hwe-22.04 ii \n"
            "linux-image-6.5.0-41-generic ii \nlinux-image-unsigned-6.5.0-44-generic ii \n",
            ["linux-headers-6.5.0-41-generic", "linux-headers-generic-hwe-22.04"],
        ),
        (
            ROCKY94,
            "RedHat",
            "/boot/vmlinuz-5.14.0-503.14.1.el9_5.x86_64\n",
            [
                "kernel-devel-5.14.0-427.13.1.el9_4.x86_64",
                "kernel-headers",
                "kernel-devel-5.14.0-503.14.1.el9_5.x86_64",
            ],
        ),
    ],
    ids=["debian12", "ubuntu-hwe", "rocky-newer-boot-kernel"],
)
def test_headers_for_the_running_kernel_and_the_next_one(
    facts: dict[str, str], vars_file: str, kernels: str, want: list[str]
) -> None:
    got = _role_value(
        "nvidia_driver",
        [vars_file],
        facts,
        "__nvidia_driver_header_packages",
        nvidia_driver_version="570.172.08",
        __nvidia_driver_kernels={"stdout": kernels, "stdout_lines": kernels.splitlines()},
    )
    assert got == want


def test_the_kernel_is_held_where_the_driver_was_built() -> None:
    kernels = (
        "linux-generic ii \nlinux-image-generic ii \nlinux-headers-generic ii \n"
        "linux-image-6.8.0-45-generic ii \n"
    )
    hold = _role_value(
        "nvidia_driver",
        ["Ubuntu"],
        {**UBUNTU2204, "distribution_version": "24.04", "kernel": "6.8.0-45-generic"},
        "__nvidia_driver_kernel_hold_packages",
        nvidia_driver_version="570.172.08",
        __nvidia_driver_kernels={"stdout_lines": kernels.splitlines()},
    )
    assert hold == ["linux-image-generic", "linux-headers-generic", "linux-generic"]
    blacklist = _role_value(
        "nvidia_driver",
        ["Ubuntu"],
        UBUNTU2204,
        "__nvidia_driver_uu_blacklist",
        nvidia_driver_version="570.172.08",
        __nvidia_driver_kernels={"stdout_lines": kernels.splitlines()},
    )
    assert blacklist[:3] == ["^linux-image-", "^linux-headers-", "^linux-modules-"]
    template = (
        ROLES / "nvidia_driver" / "templates" / "unattended-upgrades-kernel.conf.j2"
    ).read_text()
    assert "Unattended-Upgrade::Package-Blacklist {" in template
    hold_tasks = _tasks("nvidia_driver", "kernel_hold.yml")
    hold = _pinned(
        "nvidia_driver", "kernel_hold.yml", "Hold the kernel metapackages (apt)", "hold.yml"
    )
    assert hold["pinned_packages_names"] == "{{ __nvidia_driver_kernel_hold_packages }}"
    assert (
        _named(_tasks(PINNED, "hold.yml"), HOLD)["ansible.builtin.dpkg_selections"]["selection"]
        == "hold"
    )
    lock = _named(hold_tasks, "Versionlock the installed kernels")["ansible.builtin.command"][
        "argv"
    ]
    assert "'versionlock', 'add'" in lock
    assert "__nvidia_driver_kernel_lock_names" in lock
    include = _named(
        _tasks("nvidia_driver", "install.yml"), "Kernel hold (the kernel the driver was built for)"
    )
    assert include["when"] == [
        "nvidia_driver_kernel_hold | bool",
        "not __nvidia_driver_in_container",
    ]


def _sb_var(value: int) -> str:
    """efivarfs SecureBoot-<guid>: 4 attribute bytes, then the value, as slurp returns it."""
    return base64.b64encode(bytes([0x06, 0, 0, 0, value])).decode()


@pytest.mark.parametrize(
    ("sb", "efivar", "enabled"),
    [
        ({"rc": 0, "stdout": "SecureBoot enabled"}, None, True),
        ({"rc": 0, "stdout": "SecureBoot disabled"}, None, False),
        ({"rc": 2, "stdout": ""}, _sb_var(1), True),  # no mokutil: the EFI variable
        ({"rc": 2, "stdout": ""}, _sb_var(0), False),
        ({"rc": 1, "stdout": "EFI variables are not supported on this system"}, None, False),
    ],
    ids=["mokutil-on", "mokutil-off", "efivar-on", "efivar-off", "no-efi"],
)
def test_secure_boot_detection(sb: dict[str, Any], efivar: str | None, enabled: bool) -> None:
    got = _role_value(
        "nvidia_driver",
        ["Debian"],
        DEBIAN12,
        "__nvidia_driver_secure_boot",
        nvidia_driver_version="570.172.08",
        __nvidia_driver_sb=sb,
        __nvidia_driver_sb_var={"content": efivar} if efivar else {"failed": True},
    )
    assert bool(got) is enabled


def test_secure_boot_stops_before_the_install_unless_the_modules_are_signed(tmp_path: Path) -> None:
    mokutil = tmp_path / "mokutil"
    mokutil.write_text("#!/bin/sh\necho SecureBoot enabled\n", encoding="utf-8")
    mokutil.chmod(0o755)
    res = _run_role_tasks(
        tmp_path, "secure_boot.yml", {"__nvidia_driver_sb_argv": [str(mokutil), "--sb-state"]}
    )
    assert res.returncode != 0
    assert "Secure Boot is enabled on localhost" in res.stdout
    assert "software.driver.secure_boot_signed: true" in res.stdout
    include = _named(_tasks("nvidia_driver", "preflight.yml"), "Secure Boot")
    assert include["when"] == [
        "not __nvidia_driver_in_container",
        "not (nvidia_driver_secure_boot_signed | bool)",
    ]


def test_secure_boot_signed_is_a_cluster_yml_setting_the_role_reads() -> None:
    from gpuctl.config.model import Driver

    assert Driver(branch="570", version="570.172.08").secure_boot_signed is False
    render = (ROOT / "gpuctl" / "render" / "__init__.py").read_text(encoding="utf-8")
    assert '"nvidia_driver_secure_boot_signed": sw.driver.secure_boot_signed' in render


def test_the_initramfs_handler_runs_before_the_reboot_decision() -> None:
    tasks = _tasks("nvidia_driver", "service.yml")
    names = [t.get("name") for t in tasks]
    flush = names.index("Run the pending handlers before the reboot decision")
    assert tasks[flush]["ansible.builtin.meta"] == "flush_handlers"
    assert flush < names.index("Reboot into the installed driver")


# ------------------------------------------------------------------------------------------
# 4. No X11 stack on compute nodes; pins that exist


@pytest.mark.parametrize("modules", ["open", "proprietary"])
def test_ubuntu_gets_the_headless_set_at_revisions_the_cuda_repository_has(modules: str) -> None:
    names = _role_value(
        "nvidia_driver",
        ["Ubuntu"],
        UBUNTU2204,
        "__nvidia_driver_package_names",
        nvidia_driver_version="550.90.07",
        nvidia_driver_kernel_modules=modules,
    )
    suffix = "-open" if modules == "open" else ""
    assert f"nvidia-headless-550{suffix}" in names
    # these Depend on xserver-xorg-video-nvidia-550 and the GL libraries
    assert not [n for n in names if n.startswith(("nvidia-driver-", "cuda-drivers", "nvidia-open"))]
    # cuda-drivers-550 is 550.90.07-1 in the CUDA repository, the rest 550.90.07-0ubuntu1
    version = _role_value(
        "nvidia_driver",
        ["Ubuntu"],
        UBUNTU2204,
        "__nvidia_driver_package_version",
        nvidia_driver_version="550.90.07",
    )
    assert version == "550.90.07-0ubuntu1"


@pytest.mark.parametrize("modules", ["open", "proprietary"])
def test_el_gets_the_compute_only_set(modules: str) -> None:
    names = _role_value(
        "nvidia_driver", ["RedHat"], ROCKY94, "__nvidia_driver_package_names",
        nvidia_driver_version="570.172.08", nvidia_driver_kernel_modules=modules,
    )  # fmt: skip
    assert "nvidia-driver-cuda" in names
    assert "nvidia-driver" not in names
    assert "nvidia-driver-libs" not in names
    fm = _yaml(ROLES / "fabric_manager" / "vars" / "RedHat.yml")["__fabric_manager_driver_package"]
    assert fm in names  # Fabric Manager reads the driver version from an installed package


def test_driver_packages_go_in_without_recommends_or_weak_dependencies() -> None:
    pinned = _pinned("nvidia_driver", "install.yml", "Driver packages at the pinned version")
    assert pinned["pinned_packages_install_recommends"] is False
    assert pinned["pinned_packages_install_weak_deps"] is False
    # the shared recipe passes both on to apt and dnf
    apt = _named(_tasks(PINNED, "apt.yml"), APT_INSTALL)["ansible.builtin.apt"]
    assert "pinned_packages_install_recommends" in apt["install_recommends"]
    dnf = _named(_tasks(PINNED, "dnf.yml"), DNF_INSTALL)["ansible.builtin.dnf"]
    assert "pinned_packages_install_weak_deps" in dnf["install_weak_deps"]


# ------------------------------------------------------------------------------------------
# 5. EL: old versionlocks and EPEL


@pytest.mark.parametrize(
    ("role", "include"),
    [
        ("nvidia_driver", "Driver packages at the pinned version"),
        ("fabric_manager", "Fabric Manager packages at the driver's version"),
    ],
)
def test_an_old_versionlock_goes_before_the_new_version_installs(role: str, include: str) -> None:
    # the role installs through the shared pinned_packages recipe (dnf.yml on EL)
    _pinned(role, "install.yml", include)
    tasks = _tasks(PINNED, "dnf.yml")
    names = [t.get("name") for t in tasks]
    assert names.index(DROP_LOCK) < names.index(DNF_INSTALL)
    argv = _named(tasks, DROP_LOCK)["ansible.builtin.command"]["argv"]
    assert argv[:4] == ["dnf", "-q", "versionlock", "delete"]


def test_old_lock_is_recognised_and_the_pinned_one_kept() -> None:
    locks = "nvidia-driver-cuda-3:570.133.20-1.el9.*\nkmod-nvidia-open-dkms-3:570.133.20-1.el9.*\n"
    pinned = _pinned("nvidia_driver", "install.yml", "Driver packages at the pinned version")
    variables = {
        **_yaml(ROLES / PINNED / "defaults" / "main.yml"),
        **pinned,
        "__pinned_packages_locks": {"stdout": locks},
        "nvidia_driver_hold": True,
    }
    drop = _named(_tasks(PINNED, "dnf.yml"), DROP_LOCK)
    conds = drop["when"]
    for version, expect in (("570.172.08", True), ("570.133.20", False)):
        templar = Templar(
            loader=DataLoader(),
            variables=_trusted(
                {**variables, "nvidia_driver_version": version, "item": "nvidia-driver-cuda"}
            ),
        )
        got = all(templar.template(trust_as_template("{{ " + c.strip() + " }}")) for c in conds)
        assert got is expect, version


def test_el_enables_epel_and_crb_for_dkms() -> None:
    include = _named(_tasks("nvidia_driver", "install.yml"), "EPEL and CRB for dkms (dnf)")
    assert include["ansible.builtin.include_tasks"] == "epel.yml"
    assert "ansible_facts['os_family'] == 'RedHat'" in include["when"]
    epel = _tasks("nvidia_driver", "epel.yml")
    crb = _named(epel, "Enable CRB (Rocky Linux, AlmaLinux)")["ansible.builtin.command"]["argv"]
    assert crb == ["dnf", "config-manager", "--set-enabled", "crb"]
    assert "epel-release" in _named(epel, "EPEL release package")["ansible.builtin.dnf"]["name"]
