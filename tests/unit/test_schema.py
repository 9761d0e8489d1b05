"""`gpuctl schema`: a valid JSON Schema; accepts the examples, rejects what the model rejects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from helpers import ROOT
from typer.testing import CliRunner

from gpuctl.cli.app import app
from gpuctl.config.schema import json_schema

EXAMPLES = sorted((ROOT / "inventories").glob("*.yml"))


def _validator() -> jsonschema.Draft202012Validator:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_cli_prints_the_schema(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0
    printed = json.loads(result.stdout)
    assert printed == json_schema()
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert printed["additionalProperties"] is False
    target = tmp_path / "cluster.schema.json"
    result = CliRunner().invoke(app, ["schema", "-o", str(target)])
    assert result.exit_code == 0
    assert json.loads(target.read_text(encoding="utf-8")) == printed


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_schema_accepts_every_example(path: Path) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = list(_validator().iter_errors(doc))
    assert errors == []


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.update(colour="blue"), "Additional properties"),
        (lambda d: d["node_groups"][2]["gpus"].update(model="h1000"), "h1000"),
        (lambda d: d["node_groups"][2]["gpus"].update(count="eight"), "eight"),
        (lambda d: d.pop("software"), "software"),
        (lambda d: d["software"]["driver"].update(kernel_modules="closed"), "closed"),
    ],
)
def test_schema_rejects_what_the_model_rejects(mutate: Any, fragment: str) -> None:
    doc = yaml.safe_load((ROOT / "inventories" / "hgx-h100-ndr.yml").read_text(encoding="utf-8"))
    mutate(doc)
    messages = [e.message for e in _validator().iter_errors(doc)]
    assert any(fragment in m for m in messages), messages


def test_every_field_has_a_description_for_editor_hover() -> None:
    missing: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for name, prop in node.get("properties", {}).items():
                if "description" not in prop:
                    missing.append(f"{where}.{name}")
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(json_schema(), "#")
    assert missing == []


def test_committed_schema_beside_the_examples_is_current() -> None:
    """The examples' editor line points at inventories/cluster.schema.json: keep it current."""
    committed = json.loads((ROOT / "inventories" / "cluster.schema.json").read_text("utf-8"))
    assert committed == json_schema(), "run: gpuctl schema -o inventories/cluster.schema.json"
    for path in EXAMPLES:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first == "# yaml-language-server: $schema=./cluster.schema.json", path
