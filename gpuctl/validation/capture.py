"""Captured tool outputs as the project stores them (tests/fixtures, benchmarks).

A capture file starts with a provenance header (`# source:`, `# hardware:`, ending with the
first `# ---` line); everything after that line is the tool's output exactly as captured (CRLF,
tabs and trailing blanks included). nccl-tests output lines also start with `#`, so only the
first `# ---` line ends the header.
"""

from __future__ import annotations

from pathlib import Path


def capture_output(path: Path) -> str:
    """The output after the provenance header; ValueError when the file has no header."""
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\r\n") == "# ---":
            return "".join(lines[i + 1 :])
    raise ValueError(f"{path}: no '# ---' provenance header")
