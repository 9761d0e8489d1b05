"""Rollout defaults and the BMC (Redfish) access that firmware rollouts use."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpuctl.config.model.validation import Level
from gpuctl.config.types import Port, StrictModel


class Rollout(StrictModel):
    """Defaults for `gpuctl rollout`."""

    canary: int = Field(1, ge=0, description="Nodes updated alone first; 0 skips the canary.")
    batch_size: int | None = Field(
        None, ge=1, description="Nodes per batch after the canary (exclusive with max_unavailable)."
    )
    max_unavailable: Annotated[str, Field(pattern=r"^(100|[1-9][0-9]?)%$")] | int | None = Field(
        None,
        description='Most compute nodes out of service at once: a count or a percentage ("10%").',
    )
    failure_threshold: int = Field(
        1, ge=1, description="Halt the rollout once this many nodes have failed."
    )
    drain_timeout_s: int = Field(3600, ge=1, description="Longest wait for running jobs to end.")
    reboot_timeout_s: int = Field(1800, ge=1, description="Longest wait for a node to come back.")
    validate_level: Level = Field(
        Level.QUICK,
        description="Validation of each updated node before it is resumed (the single-node "
        "checks of that level).",
    )
    poll_interval_s: float = Field(
        5.0, gt=0, le=300, description="Seconds between looks at Slurm while waiting for jobs."
    )


class BmcCredentials(StrictModel):
    """Where the BMC user and password come from: never cluster.yml itself.

    With `vault_file` set, that file (an Ansible Vault encrypted YAML mapping with `username`
    and `password`) is decrypted with the vault password file; otherwise the two environment
    variables are read.
    """

    username_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        "GPUCTL_BMC_USERNAME", description="Environment variable holding the BMC user name."
    )
    password_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        "GPUCTL_BMC_PASSWORD", description="Environment variable holding the BMC password."
    )
    vault_file: str | None = Field(
        None,
        min_length=1,
        description="Ansible Vault encrypted YAML with `username` and `password` (relative to "
        "the folder of cluster.yml, `~` expanded); null = use the environment.",
    )
    vault_password_file: str | None = Field(
        None,
        min_length=1,
        description="File holding the vault password (mode 0600 or stricter); null = "
        "`ANSIBLE_VAULT_PASSWORD_FILE` from the environment.",
    )


class Bmc(StrictModel):
    """How gpuctl talks to the nodes' BMCs over Redfish (HTTPS, certificates checked).

    Used by `gpuctl rollout` for `gpu-firmware` (HGX GPU firmware through the BMC's
    UpdateService, activated by a power cycle) and `bmc-firmware`. Addresses are per node group
    (`node_groups[].bmc_addresses`).
    """

    credentials: BmcCredentials = Field(
        default_factory=lambda: BmcCredentials(), description="Where the credentials come from."
    )
    port: Port = Field(443, description="HTTPS port of the Redfish service.")
    ca_bundle: str | None = Field(
        None,
        min_length=1,
        description="PEM file of the CAs that signed the BMCs' certificates (relative to the "
        "folder of cluster.yml); null = the system's trust store.",
    )
    verify_tls: bool = Field(
        True,
        description="Check BMC certificates. false accepts any certificate (a man in the middle "
        "would get the BMC password): only for a lab you own.",
    )
    request_timeout_s: int = Field(30, ge=1, le=600, description="Timeout of one request.")
    update_timeout_s: int = Field(
        3600, ge=60, description="Longest wait for a firmware update task to finish."
    )
    system_id: str | None = Field(
        None,
        min_length=1,
        description="Redfish ComputerSystem Id to power cycle; null = the service's only one.",
    )
    manager_id: str | None = Field(
        None, min_length=1, description="Redfish Manager Id of the BMC; null = the only one."
    )
    gpu_inventory_prefix: str = Field(
        "HGX_FW_GPU_",
        min_length=1,
        description="FirmwareInventory Ids of the GPUs start with this (HGX: "
        "`HGX_FW_GPU_SXM_1` ...); their versions are the node's GPU firmware.",
    )
    bmc_inventory_id: str | None = Field(
        None,
        min_length=1,
        description="FirmwareInventory Id of the BMC image, the update's target; null = "
        "no Targets (the BMC picks the components the package holds).",
    )
    power_cycle: Literal["PowerCycle", "ForceRestart", "AuxPowerCycle"] = Field(
        "PowerCycle",
        description="ComputerSystem.Reset type that activates new GPU firmware "
        "(the GPUs must lose power; a warm reboot keeps the old firmware).",
    )
