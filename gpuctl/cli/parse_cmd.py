"""`gpuctl parse KIND FILE`: run one parser on saved output and print the JSON envelope."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import print_json
from gpuctl.errors import UsageError
from gpuctl.fileio import TooLarge, UnsafePath, read_regular
from gpuctl.validation.parsing import parse, registry


def _kinds() -> list[str]:
    return list(registry())


def commands_by_kind() -> dict[str, list[str]]:
    """Per kind, the command lines gpuctl runs whose output is parsed as that kind, taken from
    where they are declared: the per-node probe table (``{gpus}`` shown as ``<gpus>``), the
    ib_write_bw pair and the multi-node nccl-tests run of ``gpuctl validate`` (shown for two
    8-GPU nodes), the rollout's adapter firmware queries, the Slurm node query. A kind that
    gpuctl never runs itself (its parser reads saved output) is absent."""
    from gpuctl import slurm
    from gpuctl.rollout import tools
    from gpuctl.validation import burn, gpudirect, multinode, probes

    sources: dict[str, list[tuple[str, ...]]] = {}
    for probe in probes.PROBES:
        if probe.per_gpu or probe.burn:  # one run per GPU, the burn loop's: below
            continue
        argv = tuple(
            arg.format(gpus="<gpus>", hca="<hca>", port="<port>", mounts="<paths>", cuda="<cuda>")
            for arg in probe.argv
        )
        sources.setdefault(probe.parser, []).append(argv)
    port = probes.IB_WRITE_BW_BASE_PORT
    sources.setdefault("perftest", []).extend(
        [
            probes.ib_write_bw_server("<hca>", port),
            probes.ib_write_bw_client("<hca>", port, "<server>"),
        ]
    )
    gdr = gpudirect.server_argv(
        "<hca>", gpudirect.BASE_PORT, 0, gpudirect.PEERMEM, probes.IB_WRITE_BW_SIZE
    )
    sources["perftest"] += [gdr, (*gdr, "<node>")]
    sources.setdefault("nccl", []).append(multinode.srun_argv(("node1", "node2"), 8))
    for kind, argvs in burn.shown_commands().items():
        sources.setdefault(kind, []).extend(argvs)
    sources.setdefault("mlxfwmanager", []).append(tuple(tools.nic_query_argv()))
    sources.setdefault("flint-query", []).append(tuple(tools.flint_query_argv("<device>")))
    sources.setdefault("scontrol-node", []).append(slurm.show_argv())
    commands: dict[str, list[str]] = {}
    for kind, argvs in sources.items():
        for argv in argvs:
            line = " ".join(argv)
            if line not in commands.setdefault(kind, []):
                commands[kind].append(line)
    return commands


def register(app: typer.Typer) -> None:
    app.command("parse")(parse_cmd)


def parse_cmd(
    kind: Annotated[
        str,
        typer.Argument(
            help="Kind of output (see docs/parse.md); `gpuctl parse list` lists them.",
            autocompletion=_kinds,
            show_default=False,
        ),
    ],
    file: Annotated[
        str,
        typer.Argument(help="File with the tool's output; `-` reads stdin.", show_default=False),
    ] = "-",
    fields: Annotated[
        str | None,
        typer.Option(help="smi-csv without a header: the --query-gpu fields, comma-separated."),
    ] = None,
) -> None:
    """Parse saved tool output into JSON: {kind, schema_version, recognised, data, problems}.

    Exit 0 when the input was recognised as that kind, 1 when it was not.
    """
    kinds = registry()
    if kind == "list":
        commands = commands_by_kind()
        for spec in kinds.values():
            typer.echo(f"{spec.kind:16} {spec.description}")
            for command in commands.get(spec.kind, []):
                typer.echo(f"{'':16}   $ {command}")
        return
    if kind not in kinds:
        raise UsageError(f"unknown kind {kind!r}; kinds: {', '.join(kinds)}")
    text = _read(file)
    options: dict[str, object] = {}
    if fields is not None:
        if "fields" not in kinds[kind].options:
            raise UsageError(f"--fields applies to smi-csv, not {kind}")
        options["fields"] = [f.strip() for f in fields.split(",") if f.strip()]
    result = parse(kind, text, **options)
    print_json(result.to_json())
    if not result.recognised:
        raise typer.Exit(ExitCode.CHECK_FAILED)


# a tool's output saved to a file; nothing gpuctl parses is near this
MAX_INPUT = 64 * 1024 * 1024


def _read(file: str) -> str:
    try:
        if file == "-":
            raw = sys.stdin.buffer.read(MAX_INPUT + 1)
            if len(raw) > MAX_INPUT:
                raise TooLarge(f"standard input: larger than {MAX_INPUT} bytes")
        else:
            raw = read_regular(Path(file), limit=MAX_INPUT)
    except (UnsafePath, TooLarge) as exc:
        raise UsageError(f"cannot read {file}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from None
    return raw.decode("utf-8", errors="replace")
