"""docs/security.md names the test behind each guarantee: those tests exist."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ROOT


def test_every_test_named_in_the_security_page_exists() -> None:
    page = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    here = Path(__file__).parent
    modules = set(re.findall(r"(test_sec_[a-z_]+\.py)", page))
    assert modules, "the page names no test module"
    for module in modules:
        assert (here / module).is_file(), module
    sources = "\n".join(p.read_text(encoding="utf-8") for p in here.glob("test_sec_*.py"))
    names = set(re.findall(r"::(test_[a-z0-9_]+)", page))
    assert len(names) > 20
    missing = sorted(n for n in names if not re.search(rf"^def {n}\(", sources, re.M))
    assert not missing, missing
