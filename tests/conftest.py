"""Shared fixtures: a plain terminal for every test, and a valid cluster document to break."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import yaml

from gpuctl.starter import starter


@pytest.fixture(autouse=True)
def _plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """No colours and wide lines, so output is stable and one problem stays on one line."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


@cache
def _valid_text() -> str:
    return starter("hgx-h100", 4)


@pytest.fixture
def valid_doc() -> dict[str, Any]:
    """A fresh dict of a valid cluster (the hgx-h100 starter with 4 nodes); safe to mutate."""
    doc = yaml.safe_load(_valid_text())
    assert isinstance(doc, dict)
    return doc
