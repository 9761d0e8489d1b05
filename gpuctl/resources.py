"""Where gpuctl's data files and templates live, installed or in a source checkout."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"


@cache
def templates_dir() -> Path:
    """The top-level ``templates/`` directory (copied into the wheel as ``gpuctl/_templates``)."""
    installed = PACKAGE_DIR / "_templates"
    if installed.is_dir():
        return installed
    source = PACKAGE_DIR.parent / "templates"
    if source.is_dir():
        return source
    raise FileNotFoundError("gpuctl's templates are missing: reinstall gpuctl")  # pragma: no cover


@cache
def playbooks_dir() -> Path:
    """The top-level ``playbooks/`` directory (copied into the wheel as ``gpuctl/_playbooks``)."""
    installed = PACKAGE_DIR / "_playbooks"
    if installed.is_dir():
        return installed
    source = PACKAGE_DIR.parent / "playbooks"
    if source.is_dir():
        return source
    raise FileNotFoundError("gpuctl's playbooks are missing: reinstall gpuctl")  # pragma: no cover


@cache
def load_data(name: str) -> Any:
    """Parse one of the YAML files in ``gpuctl/data`` (cached; treat the result as read-only)."""
    with (DATA_DIR / name).open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)
