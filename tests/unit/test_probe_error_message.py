"""What meta.json's ``error`` says of a probe that failed with nothing on stdout
(gpuctl.validation.bundle.probe_meta): what it said on stderr, on one line, escaped, short."""

from __future__ import annotations

from gpuctl.remote import ExecResult
from gpuctl.validation.bundle import probe_meta

ARGV = ("nvidia-smi", "-q", "-x")


def error_of(rc: int, stderr: bytes, stdout: bytes = b"") -> str | None:
    meta = probe_meta(ExecResult(stdout=stdout, stderr=stderr, rc=rc), ARGV, 30)
    error = meta["error"]
    assert error is None or isinstance(error, str)
    return error


def test_a_tool_that_printed_on_stderr_is_quoted_not_said_to_have_printed_nothing() -> None:
    """It said "exited with 6 and printed nothing: No devices were found"."""
    error = error_of(6, b"No devices were found\n")
    assert error == "nvidia-smi exited with 6, nothing on stdout; stderr: No devices were found"
    assert "printed nothing" not in error


def test_a_tool_that_printed_nothing_at_all_says_so() -> None:
    assert error_of(9, b"") == "nvidia-smi exited with 9 and printed nothing"
    assert error_of(9, b"\n  \n") == "nvidia-smi exited with 9 and printed nothing"


def test_stderr_is_one_line_with_control_characters_escaped_and_shortened() -> None:
    error = error_of(1, b"first\n\x1b[2Jsecond\n" + b"x" * 500 + b"\nthe reason\n")
    assert error is not None
    assert "\x1b" not in error
    assert "\n" not in error
    quoted = error.split("stderr: ", 1)[1]
    assert quoted.startswith("...")
    assert quoted.endswith("; the reason")  # tools say why last
    assert len(quoted) == 200
    short = error_of(1, b"a\n\x1b[31mred\n")
    assert short == "nvidia-smi exited with 1, nothing on stdout; stderr: a; \\x1b[31mred"


def test_output_on_stdout_is_for_the_parser() -> None:
    assert error_of(1, b"warning\n", stdout=b"<xml/>") is None
