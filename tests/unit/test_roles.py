"""Every role under playbooks/roles declares each input twice, alike: in defaults/main.yml and in
meta/argument_specs.yml; every public variable carries the role's name as its prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import ROOT

ROLES_DIR = ROOT / "playbooks" / "roles"
ROLES = sorted(p for p in ROLES_DIR.iterdir() if p.is_dir()) if ROLES_DIR.is_dir() else []


def _prefix(role: Path) -> str:
    return role.name.replace("-", "_") + "_"


def _defaults(role: Path) -> set[str]:
    data = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    assert isinstance(data, dict)
    return set(data)


def _spec_options(role: Path) -> set[str]:
    data = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    specs = data["argument_specs"]
    return {name for spec in specs.values() for name in (spec.get("options") or {})}


def test_there_are_roles() -> None:
    assert ROLES, ROLES_DIR


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_and_argument_specs_name_the_same_variables(role: Path) -> None:
    defaults, options = _defaults(role), _spec_options(role)
    assert defaults - options == set(), "in defaults/main.yml, not in meta/argument_specs.yml"
    assert options - defaults == set(), "in meta/argument_specs.yml, not in defaults/main.yml"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_public_variables_start_with_the_role_name(role: Path) -> None:
    names = _defaults(role) | _spec_options(role)
    assert sorted(n for n in names if not n.startswith(_prefix(role))) == []


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_internal_variables_are_double_underscore_and_role_prefixed(role: Path) -> None:
    for path in sorted((role / "vars").glob("*")):
        assert path.suffix == ".yml", path
        data = yaml.safe_load(path.read_text()) or {}
        bad = [n for n in data if not n.startswith("__" + _prefix(role))]
        assert bad == [], path
