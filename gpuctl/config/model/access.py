"""SSH access and package sources: how gpuctl reaches the nodes, where their packages come from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpuctl.config.types import Port, StrictModel, Url
from gpuctl.config.values import HostName, LoginName, NoProxyEntry


class JumpHost(StrictModel):
    """An SSH bastion every connection goes through (ProxyJump)."""

    host: HostName = Field(description="IP address or host name of the jump host.")
    user: LoginName | None = Field(
        None, description="SSH user on the jump host (default: `ssh.user`)."
    )
    port: Port = Field(22, description="SSH port of the jump host.")


class Ssh(StrictModel):
    """How gpuctl and Ansible reach the nodes."""

    user: LoginName = Field("root", description="SSH login user on every node.")
    private_key: str | None = Field(
        None,
        min_length=1,
        description="Private key file (`~` expanded); null uses the SSH agent / default keys.",
    )
    known_hosts: str = Field(
        "known_hosts",
        min_length=1,
        description="The nodes' SSH host keys (OpenSSH known_hosts format; relative to the "
        "folder of cluster.yml, `~` expanded). Host keys are always checked against it.",
    )
    port: Port = Field(22, description="SSH port on the nodes.")
    jump_host: JumpHost | None = Field(None, description="Optional bastion (ProxyJump).")
    become: bool = Field(
        True,
        description="Escalate with sudo on the nodes; must be true unless `user` is root.",
    )
    connect_timeout_s: int = Field(10, ge=1, le=600, description="SSH connect timeout in seconds.")


# an apt suite: a distribution or a flat path ending in "/" ("./"); a component
_APT_SUITE = r"^(\./|[A-Za-z0-9][A-Za-z0-9._~+/-]*)$"
_APT_COMPONENT = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"


class SlurmSource(StrictModel):
    """A package repository with Slurm, added by the Slurm roles on every node that runs Slurm
    (controller, compute and login nodes), its packages preferred over the OS's (apt: a pin at
    priority 1001 on the repository's host; dnf: repository priority 1)."""

    url: Url = Field(description="apt: the repository URL (before the suite); dnf: the baseurl.")
    suite: Annotated[str, Field(pattern=_APT_SUITE, max_length=128)] | None = Field(
        None,
        description="apt only: a distribution (`jammy`) or a flat repository's path ending in "
        "`/` (`./`); null = the node's codename. Must be null for dnf.",
    )
    components: list[Annotated[str, Field(pattern=_APT_COMPONENT, max_length=64)]] | None = Field(
        None,
        max_length=16,
        description="apt only: the components; null = `[main]`, or `[]` for a flat suite "
        "(which must have none). Must be null for dnf.",
    )
    packages: Literal["distribution", "schedmd"] = Field(
        "distribution",
        description="Package names: `distribution` (Debian/Ubuntu `slurmd`, `slurmctld`, "
        "`slurm-client`; EL `slurm`, `slurm-slurmd`, `slurm-slurmctld`) or `schedmd` (SchedMD's "
        "own packaging: Debian/Ubuntu `slurm-smd-*`; EL the same names as `distribution`).",
    )
    gpg_key: Url | None = Field(
        None,
        description="URL of the repository's signing key (apt: armored, kept as "
        "`/etc/apt/keyrings/gpuctl-slurm.asc` for `signed-by`; dnf: `gpgkey`); required unless "
        "`trusted`.",
    )
    trusted: bool = Field(
        False,
        description="An unsigned repository (a site or lab repository): apt `[trusted=yes]`, dnf "
        "`gpgcheck=0`. An explicit opt-in; give `gpg_key` or `trusted: true`, not both.",
    )

    @model_validator(mode="after")
    def _signed_and_shaped(self) -> SlurmSource:
        if self.gpg_key is None and not self.trusted:
            raise ValueError(
                "give gpg_key (the URL of the repository's signing key) or trusted: true (an "
                "unsigned site repository)"
            )
        if self.gpg_key is not None and self.trusted:
            raise ValueError("give gpg_key or trusted: true, not both")
        flat = self.suite is not None and self.suite.endswith("/")
        if flat and self.components:
            raise ValueError(f'suite "{self.suite}" is a flat repository: components must be []')
        if not flat and self.components == []:
            raise ValueError(
                "components is [] but suite is a distribution (null = the node's codename): "
                "name the components, or end suite with / for a flat repository"
            )
        return self


class PackageSources(StrictModel):
    """Where packages come from. Point every URL at your own mirror for an air-gapped cluster."""

    os_mirror: Url | None = Field(
        None,
        description="Mirror of the OS distribution archive (Debian, Ubuntu: apt); it replaces "
        "the nodes' OS sources (`<codename>`, `<codename>-updates`; Ubuntu also "
        "`<codename>-security`). null keeps the nodes' sources. EL: not supported yet.",
    )
    os_security_mirror: Url | None = Field(
        None,
        description="Debian only, with `os_mirror`: mirror of Debian's security archive "
        "(`<codename>-security`); null: no security source while `os_mirror` is set.",
    )
    cuda: Url | None = Field(
        "https://developer.download.nvidia.com/compute/cuda/repos",
        description="NVIDIA CUDA repository root (driver, Fabric Manager, NCCL, DCGM); "
        "`<distro>/<arch>/` is appended. null = the nodes' own package sources already carry "
        "NVIDIA's packages (a site mirror) and gpuctl adds no repository.",
    )
    doca: Url = Field(
        "https://linux.mellanox.com/public/repo/doca",
        description="NVIDIA DOCA repository root; used only with `rdma.stack: doca-ofed`.",
    )
    nccl_tests: Url = Field(
        "https://github.com/NVIDIA/nccl-tests.git",
        description="Git URL of nccl-tests (or a mirror of it).",
    )
    perftest: Url = Field(
        "https://github.com/linux-rdma/perftest.git",
        description="Git URL of linux-rdma/perftest (or a mirror of it), built with CUDA where "
        "`software.perftest` is set.",
    )
    slurm: SlurmSource | None = Field(
        None,
        description="A package repository the Slurm roles add for Slurm (a site repository or "
        "SchedMD-built packages), preferred over the OS's own Slurm packages; needs "
        "`software.slurm`. null = the OS's repositories (EL: EPEL, which gpuctl enables).",
    )
    pypi_index: Url | None = Field(
        None,
        description="Python package index for tools installed on nodes (a site mirror); null = "
        "default. gpuctl's node check installs gpuctl from it when `gpuctl_wheelhouse` is null.",
    )
    gpuctl_wheelhouse: Annotated[str, Field(pattern=r"^/")] | None = Field(
        None,
        description="Absolute path, on the machine that runs `gpuctl provision`, of a directory "
        "with gpuctl's wheel and the wheels of its node requirements (docs/provisioning.md); "
        "copied to the nodes for `slurm.health_check`, which then need no package index.",
    )
    http_proxy: Url | None = Field(
        None,
        description="HTTP(S) proxy the nodes use for every download: apt/dnf (a 0600 config "
        "file), git, pip and file downloads (the plays' environment).",
    )
    no_proxy: list[NoProxyEntry] = Field(
        default_factory=list,
        description="Host names, domains (`.example.org`) or IP addresses the nodes reach "
        "without `http_proxy` (a site mirror); localhost is always direct.",
    )

    @model_validator(mode="after")
    def _security_mirror_needs_mirror(self) -> PackageSources:
        if self.os_security_mirror is not None and self.os_mirror is None:
            raise ValueError("os_security_mirror is used only with os_mirror; set both or neither")
        return self
