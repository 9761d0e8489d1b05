"""`gpuctl-node-check`: `gpuctl node-check` as a program of its own, light to start.

Slurm runs it as HealthCheckProgram on every node every HealthCheckInterval, and nodes get a
virtualenv with only what node-check needs (requirements of the gpuctl_node_check role): the
full `gpuctl` application imports every command (provisioning, Jinja, reports, the lab) and
would neither start there nor start fast. This one imports the node-check command only, and
translates errors into exit codes as `gpuctl` does (2 configuration/usage, 1 a failed check,
70 a bug with its traceback, 130 interrupted).
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.nodecheck_cmd import node_check_cmd
from gpuctl.errors import ConfigError, EnvironmentProblem, GpuctlError, UsageError


class _Boundary(TyperGroup):
    """The error boundary of gpuctl.cli.app, without importing the whole application."""

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click Context
        try:
            return super().invoke(ctx)
        except (ConfigError, UsageError, EnvironmentProblem) as exc:
            problems = exc.problems if isinstance(exc, ConfigError) and exc.problems else (exc,)
            for problem in problems:
                sys.stderr.write(f"error: {problem}\n")
            raise typer.Exit(ExitCode.CONFIG) from None
        except GpuctlError as exc:
            sys.stderr.write(f"error: {exc}\n")
            raise typer.Exit(ExitCode.CHECK_FAILED) from None
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            raise typer.Exit(ExitCode.INTERRUPTED) from None
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception:
            sys.stderr.write(traceback.format_exc())
            sys.stderr.write(
                "internal error: this is a bug in gpuctl; please report it with the traceback "
                "above\n"
            )
            raise typer.Exit(ExitCode.INTERNAL) from None


app = typer.Typer(
    name="gpuctl-node-check",
    cls=_Boundary,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    subcommand_metavar="",
    context_settings={"help_option_names": ["-h", "--help"]},
)
# the command is the group's own callback: `gpuctl-node-check --level quick`, no subcommand
app.callback(invoke_without_command=True)(node_check_cmd)


def main() -> None:
    sys.exit(app(prog_name="gpuctl-node-check"))
