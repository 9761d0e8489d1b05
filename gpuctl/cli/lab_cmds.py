"""`gpuctl lab ...`: a simulated GPU cluster of systemd-nspawn nodes on this machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpuctl.cli.output import err_console, out_console, print_json
from gpuctl.lab import lab

app = typer.Typer(
    name="lab",
    help="A GPU cluster on this machine: systemd-nspawn nodes, real SSH/systemd, simulated "
    "GPUs and InfiniBand. Needs root.",
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="lab")


def _profiles() -> list[str]:
    return lab.profile_names()


@app.command("up")
def up(
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes", "-n", min=2, max=17, help="Nodes: one controller + compute (one profile)."
        ),
    ] = 3,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            "--profile",
            "-p",
            help="Simulated hardware of the compute nodes (gpuctl/lab/profiles). Repeat as "
            "NAME:COUNT for one node group per profile (then --nodes is not used).",
            autocompletion=_profiles,
        ),
    ] = None,
    os_name: Annotated[
        str,
        typer.Option("--os", help=f"Node OS: {', '.join(lab.OS_RELEASES)}."),
    ] = lab.DEFAULT_OS,
) -> None:
    """Start the lab (build the cached base image of the node OS first if needed). Idempotent."""
    result = lab.up(nodes - 1, lab.DEFAULT_PROFILE, os_name, profile or None)
    console = err_console()
    if result.base_built:
        console.print(f"built the {escape(os_name)} base image (cached for next time)")
    started = ", ".join(result.started) or "none (already running)"
    console.print(f"lab up in {result.seconds:.1f} s; started: {escape(started)}")
    _print_status(result.status)


@app.command("status")
def status(as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """Nodes, addresses and state."""
    st = lab.status()
    if as_json:
        print_json(st.to_json())
        return
    _print_status(st)


def _print_status(st: lab.LabStatus) -> None:
    console = out_console()
    if not st.nodes:
        console.print("the lab is down")
        return
    for node in st.nodes:
        console.print(f"{node.name:10} {node.address:15} {node.state:8} {','.join(node.roles)}")
    if st.cluster_yml:
        console.print(f"cluster.yml: {escape(str(st.cluster_yml))}")


@app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node name.")],
) -> None:
    """Open a shell on a node, or run a command: gpuctl lab ssh gpu001 -- nvidia-smi."""
    command = [a for a in ctx.args if a != "--"]
    argv = lab.ssh_argv(lab.address_of(node), command or None, tty=not command)
    os.execvp(argv[0], argv)  # noqa: S606 - replaces this process with ssh, argv list


@app.command("reboot")
def reboot(node: Annotated[str, typer.Argument(help="Node name.")]) -> None:
    """Reboot a node from inside (systemctl reboot) and wait until it is back."""
    before, after = lab.reboot(node)
    err_console().print(f"{escape(node)} rebooted (boot id {before[:8]} -> {after[:8]})")


@app.command("firmware-image")
def firmware_image(
    version: Annotated[str, typer.Argument(help="Firmware version the image carries.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Image file to write.", dir_okay=False)],
    node: Annotated[
        str, typer.Option("--node", help="Node whose adapters or GPUs it is for.")
    ] = "gpu001",
    component: Annotated[
        str,
        typer.Option(
            "--component",
            help="nic-firmware (a ConnectX image), gpu-firmware or bmc-firmware (a package for "
            "the lab's simulated BMCs).",
            autocompletion=lambda: list(lab.FIRMWARE_COMPONENTS),
        ),
    ] = "nic-firmware",
) -> None:
    """Write a lab-only firmware image for `gpuctl rollout --component ...` on the lab: the
    lab's mlxfwmanager burns a nic-firmware one, the lab's simulated BMCs take gpu-firmware and
    bmc-firmware packages; real tools and BMCs refuse them."""
    target = lab.firmware_image(node, version, out, component)
    if component == "nic-firmware":
        what = f"PSID {target}, FW {escape(version)}"
    elif target:
        what = f"{component} {escape(version)} for {escape(target)} GPUs"
    else:
        what = f"{component} {escape(version)}"
    err_console().print(f"wrote {escape(str(out))}: {what} (lab only)")


@app.command("fault")
def fault(
    node: Annotated[str, typer.Argument(help="Node name.")],
    name: Annotated[str | None, typer.Argument(help="Fault (see docs/lab-hardware.md).")] = None,
    value: Annotated[str, typer.Argument(help="The fault's value, e.g. a GPU index.")] = "",
    clear: Annotated[bool, typer.Option("--clear", help="Clear this fault, or all.")] = False,
) -> None:
    """Inject or clear a simulated hardware fault: gpuctl lab fault gpu001 gpu_lost 3."""
    if clear:
        faults = lab.clear_faults(node, name)
    elif name is None:
        faults = lab.faults_of(node)
    else:
        faults = lab.inject_fault(node, name, value)
    print_json({"node": node, "faults": faults})


@app.command("down")
def down() -> None:
    """Remove every node, mount, namespace, veth, bridge and process the lab made."""
    removed = lab.down()
    err_console().print(f"lab down; removed {', '.join(removed) or 'nothing'}")
