# ruff: noqa: E501 - the control files are quoted verbatim, their long Depends lines included
"""The lab's Slurm repository (gpuctl/lab/slurm_repo.py): Debian's Slurm under SchedMD's names.

The control files below are Debian 13's own (`dpkg-deb -f` of slurmd_24.11.5-4+deb13u1_amd64.deb
and slurm-wlm-basic-plugins_24.11.5-4+deb13u1_amd64.deb from deb.debian.org, trixie/main, fetched
2026-12-02), trimmed to the fields the renaming reads or writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuctl.lab import lab, slurm_repo

SLURMD = """\
Package: slurmd
Source: slurm-wlm
Version: 24.11.5-4+deb13u1
Architecture: amd64
Maintainer: Debian HPC Team <debian-hpc@lists.debian.org>
Installed-Size: 1042
Pre-Depends: init-system-helpers (>= 1.54~)
Depends: libc6 (>= 2.38), libhwloc15 (>= 2.12.0), liblz4-1 (>= 0.0~r130), libnuma1 (>= 2.0.11), libpam0g (>= 0.99.7.1), slurm-wlm-basic-plugins (= 24.11.5-4+deb13u1), ucf, munge
Section: admin
Priority: optional
Homepage: https://slurm.schedmd.com
Description: SLURM compute node daemon
 SLURM, the Simple Linux Utility for Resource Management,
 is an open-source cluster resource management and job scheduling.
"""

PLUGINS = """\
Package: slurm-wlm-basic-plugins
Source: slurm-wlm
Version: 24.11.5-4+deb13u1
Architecture: amd64
Depends: libc6 (>= 2.38), libmunge2 (>= 0.5.8), systemd | systemd-standalone-sysusers | systemd-sysusers, adduser | systemd-sysusers, libpmix2t64
Recommends: slurm-wlm-plugins (= 24.11.5-4+deb13u1)
Description: SLURM basic plugins
 This package contains the SLURM basic plugins
"""


def _fields(control: str) -> dict[str, str]:
    return {
        line.split(": ", 1)[0]: line.split(": ", 1)[1]
        for line in control.splitlines()
        if ": " in line and line[0] != " "
    }


def test_slurmd_becomes_schedmds_slurm_smd_slurmd() -> None:
    out = _fields(slurm_repo.schedmd_control(SLURMD))
    assert out["Package"] == "slurm-smd-slurmd"
    assert out["Version"] == "24.11.5-4+deb13u1"  # the version stays Debian's
    assert "slurm-smd (= 24.11.5-4+deb13u1)" in out["Depends"]
    assert "slurm-wlm-basic-plugins" not in out["Depends"]
    assert "libc6 (>= 2.38)" in out["Depends"]  # other relations untouched
    # as SchedMD's debian/control: it conflicts with, and replaces, Debian's package
    assert out["Conflicts"] == "slurmd"
    assert out["Replaces"] == "slurmd"
    assert out["Pre-Depends"] == "init-system-helpers (>= 1.54~)"
    assert "SchedMD's package names" in out["Description"]


def test_the_plugins_become_slurm_smd_and_pull_in_no_debian_name() -> None:
    text = slurm_repo.schedmd_control(PLUGINS)
    out = _fields(text)
    assert out["Package"] == "slurm-smd"
    assert "Recommends" not in out  # slurm-wlm-plugins would bring Debian's names back
    assert "systemd | systemd-standalone-sysusers | systemd-sysusers" in out["Depends"]
    assert out["Conflicts"] == "slurm-wlm-basic-plugins"
    assert " This package contains the SLURM basic plugins" in text.splitlines()


def test_the_lab_asks_for_schedmds_packages_at_the_version_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    doc = yaml.safe_load(lab.lab_cluster_text(1, lab.DEFAULT_PROFILE, "debian13"))
    source = doc["package_sources"]["slurm"]
    assert source == {
        "url": "http://198.18.0.1:8081/slurm",
        "suite": "./",
        "components": [],
        "packages": "schedmd",
        "trusted": True,
    }
    assert doc["software"]["slurm"] == slurm_repo.VERSIONS["trixie"]
    assert set(slurm_repo.RENAMES.values()) == {
        "slurm-smd-slurmd",
        "slurm-smd-slurmctld",
        "slurm-smd-client",
        "slurm-smd",
    }
    # Debian 13's nodes reach Debian through the OS mirror only: no proxy in cluster.yml
    sources = doc["package_sources"]
    assert "http_proxy" not in sources
    assert sources["os_mirror"] == "http://198.18.0.1:3142/deb.debian.org/debian"
