"""The command line's contract: versions, help, exit codes, plain output, the error boundary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from gpuctl import __version__
from gpuctl.cli.app import app
from gpuctl.config.loader import load_cluster
from gpuctl.errors import RenderError
from gpuctl.starter import starter

COMMANDS = {
    "init": "Write a commented starter cluster.yml",
    "check": "Validate a cluster.yml and summarize it",
    "schema": "Print the JSON Schema of cluster.yml",
    "render": "Render the Ansible inventory",
}
ESCAPE = "\x1b["
# SGR parameters that set a colour: 30-39, 40-49, 90-97, 100-107 (38/48 start 256/true colour)
COLOUR_SGR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def valid_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yml"
    path.write_text(starter("hgx-h100", 4), encoding="utf-8")
    return path


def _no_traceback(result: Result) -> None:
    assert "Traceback" not in result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# version and help


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"gpuctl {__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", __version__)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_root_help_lists_every_command(runner: CliRunner, flag: str) -> None:
    result = runner.invoke(app, [flag])
    assert result.exit_code == 0, result.stderr
    assert "Usage: gpuctl [OPTIONS] COMMAND [ARGS]..." in result.stdout
    for command in COMMANDS:
        assert re.search(rf"^\W*{command}\s", result.stdout, re.MULTILINE), command


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_command_help(runner: CliRunner, command: str, flag: str) -> None:
    result = runner.invoke(app, [command, flag])
    assert result.exit_code == 0, result.stderr
    assert f"Usage: gpuctl {command} [OPTIONS]" in result.stdout
    assert COMMANDS[command] in result.stdout
    assert result.stderr == ""


def test_no_arguments_prints_help_and_exits_2(runner: CliRunner) -> None:
    result = runner.invoke(app, [])
    assert result.exit_code == 2
    assert "Usage: gpuctl [OPTIONS] COMMAND [ARGS]..." in result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# usage errors: exit 2, a message on stderr, nothing on stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["bogus"], "No such command 'bogus'", id="unknown-command"),
        pytest.param(["check"], "Missing argument", id="missing-argument"),
        pytest.param(["check", "--bogus", "x.yml"], "No such option: --bogus", id="unknown-option"),
        pytest.param(["init", "--nodes", "0"], "Invalid value for '--nodes'", id="nodes-below-1"),
        pytest.param(
            ["init", "--nodes", "many"], "Invalid value for '--nodes'", id="nodes-not-int"
        ),
        pytest.param(["render", "x.yml"], "Missing option '--output'", id="render-without-output"),
    ],
)
def test_usage_errors_exit_2(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert "Usage: gpuctl" in result.stderr
    _no_traceback(result)


def test_schema_output_may_not_be_a_directory(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["schema", "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert "is a directory" in result.stderr


def test_render_output_may_not_be_a_file(
    runner: CliRunner, tmp_path: Path, valid_file: Path
) -> None:
    result = runner.invoke(app, ["render", str(valid_file), "-o", str(valid_file)])
    assert result.exit_code == 2
    assert "is a file" in result.stderr


# --------------------------------------------------------------------------------------------
# init


def test_init_refuses_to_overwrite_without_force(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "cluster.yml"
    target.write_text("keep me\n", encoding="utf-8")
    result = runner.invoke(app, ["init", "-o", str(target)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {target} exists; pass --force to overwrite it\n"
    assert target.read_text(encoding="utf-8") == "keep me\n"


def test_init_force_overwrites(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "cluster.yml"
    target.write_text("keep me\n", encoding="utf-8")
    result = runner.invoke(
        app, ["init", "-p", "a100-roce", "-n", "3", "-o", str(target), "--force"]
    )
    assert result.exit_code == 0, result.stderr
    assert f"wrote {target} (profile a100-roce)" in result.stderr
    assert load_cluster(target).name


def test_init_into_a_missing_directory(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "cluster.yml"
    result = runner.invoke(app, ["init", "-o", str(target)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: cannot write {target}: ")
    _no_traceback(result)


def test_init_to_stdout_is_a_loadable_file(runner: CliRunner) -> None:
    result = runner.invoke(app, ["init", "-p", "l40s-pcie"])
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["node_groups"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["init", "-p", "dgx"],
            "error: unknown profile 'dgx'; choose one of: lab, hgx-h100, a100-roce, l40s-pcie, "
            "workstation\n",
            id="unknown-profile",
        ),
        pytest.param(
            ["init", "-p", "workstation", "-n", "2"],
            "error: profile workstation takes 1 to 1 compute nodes, not 2\n",
            id="too-many-nodes",
        ),
    ],
)
def test_init_profile_errors(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == message


# --------------------------------------------------------------------------------------------
# check, schema, render on good input


def test_check_valid_file(runner: CliRunner, valid_file: Path) -> None:
    result = runner.invoke(app, ["check", str(valid_file)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("cluster hgx-h100: valid\n")


def test_check_json(runner: CliRunner, valid_file: Path) -> None:
    result = runner.invoke(app, ["check", "--json", str(valid_file)])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["valid"] is True
    assert data["name"] == "hgx-h100"


def test_schema_is_json(runner: CliRunner) -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert "node_groups" in json.loads(result.stdout)["properties"]


# --------------------------------------------------------------------------------------------
# colour


def _forced_terminal(no_color: bool) -> dict[str, str | None]:
    return {
        "NO_COLOR": "1" if no_color else None,
        "TERM": "xterm-256color",
        "FORCE_COLOR": "1",
        "COLORTERM": "truecolor",
    }


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["check", "missing.yml"], id="config-error"),
        pytest.param(["init", "-p", "dgx"], id="usage-error"),
        pytest.param(["--version"], id="version"),
    ],
)
def test_no_color_means_no_escapes(runner: CliRunner, args: list[str]) -> None:
    result = runner.invoke(app, args, env={"NO_COLOR": "1", "TERM": "xterm-256color"})
    assert ESCAPE not in result.stdout + result.stderr


def test_no_color_wins_over_a_forced_terminal(runner: CliRunner) -> None:
    result = runner.invoke(app, ["check", "missing.yml"], env=_forced_terminal(no_color=True))
    assert result.stderr == "error: missing.yml: no such file\n1 problem found\n"


def test_forced_terminal_without_no_color_is_coloured(runner: CliRunner) -> None:
    """Control: the two tests above would see escapes if colour leaked through."""
    result = runner.invoke(app, ["check", "missing.yml"], env=_forced_terminal(no_color=False))
    assert ESCAPE in result.stderr
    assert COLOUR_SGR.search(result.stderr)


@pytest.mark.parametrize("args", [["check", "--help"], ["bogus"], ["init", "-p", "dgx"]])
def test_no_colour_codes_in_help_and_usage_errors_when_forced(
    runner: CliRunner, args: list[str]
) -> None:
    """With a forced terminal, rich may still write bold; NO_COLOR removes every colour."""
    result = runner.invoke(app, args, env=_forced_terminal(no_color=True))
    assert not COLOUR_SGR.search(result.stdout + result.stderr)
    coloured = runner.invoke(app, args, env=_forced_terminal(no_color=False))
    assert COLOUR_SGR.search(coloured.stdout + coloured.stderr)


# --------------------------------------------------------------------------------------------
# the error boundary: 1 a failed operation, 70 a bug (with traceback), 130 interrupted


def _raise(exc: BaseException) -> Any:
    def fail(*_: object, **__: object) -> Any:
        raise exc

    return fail


def test_internal_error_exits_70_with_a_traceback(
    runner: CliRunner, valid_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuctl.cli.config_cmds.summarize", _raise(RuntimeError("boom")))
    result = runner.invoke(app, ["check", str(valid_file)])
    assert result.exit_code == 70
    assert result.stdout == ""
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert "RuntimeError: boom\n" in result.stderr
    assert result.stderr.endswith(
        "internal error: this is a bug in gpuctl; please report it with the traceback above\n"
    )


def test_internal_error_in_the_loader_exits_70(
    runner: CliRunner, valid_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuctl.cli.config_cmds.load_cluster", _raise(TypeError("bad")))
    result = runner.invoke(app, ["check", str(valid_file)])
    assert result.exit_code == 70
    assert "TypeError: bad" in result.stderr


def test_keyboard_interrupt_exits_130(
    runner: CliRunner, valid_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuctl.cli.config_cmds.load_cluster", _raise(KeyboardInterrupt()))
    result = runner.invoke(app, ["check", str(valid_file)])
    assert result.exit_code == 130
    assert result.stderr == "interrupted\n"
    _no_traceback(result)


def test_failed_operation_exits_1(
    runner: CliRunner, valid_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuctl.cli.config_cmds.render_cluster", _raise(RenderError("disk full")))
    result = runner.invoke(app, ["render", str(valid_file), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.stderr == "error: disk full\n"


def test_error_text_is_not_read_as_markup(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message with [brackets] (node sets!) is printed as is, not eaten by rich markup."""
    monkeypatch.setattr(
        "gpuctl.cli.config_cmds.render_cluster", _raise(RenderError("gpu[001-004] [red]x[/red]"))
    )
    monkeypatch.setattr("gpuctl.cli.config_cmds.load_cluster", lambda _: None)
    result = runner.invoke(app, ["render", "x.yml", "-o", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr == "error: gpu[001-004] [red]x[/red]\n"


# --------------------------------------------------------------------------------------------
# the installed entry point, as a real process


def test_entry_point_exit_codes(tmp_path: Path) -> None:
    env = {**os.environ, "NO_COLOR": "1", "TERM": "xterm-256color"}
    ok = subprocess.run(
        [sys.executable, "-m", "gpuctl", "--version"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert (ok.returncode, ok.stdout) == (0, f"gpuctl {__version__}\n")
    missing = tmp_path / "missing.yml"
    bad = subprocess.run(
        [sys.executable, "-m", "gpuctl", "check", str(missing)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr == f"error: {missing}: no such file\n1 problem found\n"


def test_check_json_reports_problems_on_stdout_for_machines(tmp_path: Path) -> None:
    bad = tmp_path / "c.yml"
    bad.write_text("name: x\nnode_groups: 3\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["check", "--json", str(bad)])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["valid"] is False
    by_path = {p["path"]: p for p in data["problems"]}
    assert by_path["node_groups"]["line"] == 2
    assert by_path["node_groups"]["column"] == 14
    assert "expected a list" in by_path["node_groups"]["message"]
    assert "software" in by_path
    assert "error: " in result.stderr


def test_check_json_on_a_valid_file(tmp_path: Path) -> None:
    good = tmp_path / "c.yml"
    good.write_text(starter("workstation"), encoding="utf-8")
    result = CliRunner().invoke(app, ["check", "--json", str(good)])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["valid"] is True
    assert data["node_count"] == 1
    assert data["gpus_by_model"] == {"rtx-6000-ada": 1}
