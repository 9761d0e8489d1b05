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
        for spec in kinds.values():
            command = " ".join(spec.command) if spec.command else "-"
            typer.echo(f"{spec.kind:16} {command:40} {spec.description}")
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
