"""The `gpuctl` application and its one error boundary: library errors become one line and an
exit code; library logging and threads' uncaught exceptions go to a log, never to the terminal
(:func:`gpuctl.cli.output.library_logs_routed`); a traceback is printed for a bug only (70)."""

from __future__ import annotations

import sys
import traceback
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from gpuctl import __version__
from gpuctl.cli import (
    acceptance_cmd,
    config_cmds,
    lab_cmds,
    nodecheck_cmd,
    parse_cmd,
    provision_cmds,
    report_cmd,
    rollout_cmds,
    validate_cmd,
)
from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import LibraryLog, err_console, library_logs_routed, print_error
from gpuctl.errors import ConfigError, EnvironmentProblem, GpuctlError, UsageError


class _Boundary(TyperGroup):
    """Translates library errors into messages and exit codes, for every command."""

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click Context
        with library_logs_routed() as library_log:
            return self._invoke(ctx, library_log)

    def _invoke(self, ctx: Any, library_log: LibraryLog) -> Any:
        try:
            return super().invoke(ctx)
        except (ConfigError, UsageError, EnvironmentProblem) as exc:
            print_error(exc)
            raise typer.Exit(ExitCode.CONFIG) from None
        except GpuctlError as exc:
            print_error(exc)
            raise typer.Exit(ExitCode.CHECK_FAILED) from None
        except KeyboardInterrupt:
            err_console().print("interrupted")
            raise typer.Exit(ExitCode.INTERRUPTED) from None
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception:
            sys.stderr.write(traceback.format_exc())
            if library_log.kept:  # the only time library logging reaches the terminal
                sys.stderr.write("what libraries logged before it:\n")
                sys.stderr.write("".join(f"  {line}\n" for line in library_log.kept))
            err_console().print(
                "[red]internal error[/red]: this is a bug in gpuctl; please report it with the "
                "traceback above"
            )
            raise typer.Exit(ExitCode.INTERNAL) from None


app = typer.Typer(
    name="gpuctl",
    cls=_Boundary,
    help="Bring up GPU clusters and prove they work, from one cluster.yml.\n\n"
    "Exit codes: 0 success, 1 a check failed, 2 usage or configuration error, "
    "70 internal error (a bug), 130 interrupted.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuctl {__version__}")
        raise typer.Exit(ExitCode.OK)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """gpuctl's global options."""


config_cmds.register(app)
parse_cmd.register(app)
report_cmd.register(app)
provision_cmds.register(app)
validate_cmd.register(app)
nodecheck_cmd.register(app)
lab_cmds.register(app)
rollout_cmds.register(app)
acceptance_cmd.register(app)


def main() -> None:
    sys.exit(app(prog_name="gpuctl"))
