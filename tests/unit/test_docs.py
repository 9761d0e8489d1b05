"""docs/cluster-yml.md stays in step with the cluster.yml model, and every field is described."""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
from helpers import ROOT
from pydantic import BaseModel

from gpuctl.config import docs
from gpuctl.config.catalog import gpu_specs
from gpuctl.config.model import Cluster, GpuModel
from gpuctl.starter import starter

DOC = ROOT / "docs" / "cluster-yml.md"
REGENERATE = "run `python -m gpuctl.config.docs` to regenerate the field reference"

# a key path: `node_groups[].gpus.model`; `[]` is a list item, `{}` a mapping value
PATH_RE = re.compile(r"^[a-z_][a-z0-9_]*(\[\]|\{\})*(\.[a-z_][a-z0-9_]*(\[\]|\{\})*)*$")
TABLE_HEADER = "| Key | Type | Default | Description |"


# --------------------------------------------------------------------------------------------
# The model, walked here without the generator's help


def _submodels(annotation: Any, suffix: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield suffix, annotation
        return
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (list, tuple, set, frozenset):
        for arg in args:
            yield from _submodels(arg, suffix + "[]")
    elif origin is dict:
        yield from _submodels(args[1], suffix + "{}")
    elif origin in (Union, types.UnionType) or args:  # unions, Annotated
        for arg in args:
            yield from _submodels(arg, suffix)


def _walk() -> tuple[dict[str, type[BaseModel]], dict[str, Any]]:
    """(model path -> model, field path -> FieldInfo) for every model under Cluster."""
    models: dict[str, type[BaseModel]] = {}
    fields: dict[str, Any] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        models[path] = model
        for name, info in model.model_fields.items():
            field_path = f"{path}.{name}" if path else name
            fields[field_path] = info
            for suffix, sub in _submodels(info.annotation):
                visit(sub, field_path + suffix)

    visit(Cluster, "")
    return models, fields


MODELS, FIELDS = _walk()


# --------------------------------------------------------------------------------------------
# The document, read as an operator's table of contents


def _doc() -> str:
    assert DOC.is_file(), f"{DOC} is missing; {REGENERATE}"
    return DOC.read_text(encoding="utf-8")


def _heading(line: str) -> str | None:
    """The key path a heading names (`### node_groups[].gpus`), "" for other headings."""
    m = re.match(r"^#{2,6} +`?([^`]+?)`? *$", line)
    if m is None:
        return None
    return m.group(1) if PATH_RE.match(m.group(1)) else ""


def _heading_paths(text: str) -> list[str]:
    return [h for h in map(_heading, text.splitlines()) if h]


def _key_rows(text: str) -> list[tuple[str, str]]:
    """(section path, first cell) of every `Key | Type | Default | Description` table row."""
    out: list[tuple[str, str]] = []
    section = ""
    in_table = False
    for line in text.splitlines():
        heading = _heading(line)
        if heading is not None:
            section = heading
        if line.strip() == TABLE_HEADER:
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        first = line.strip("|").split("|")[0].strip()
        if set(first) <= {"-", ":", " "}:
            continue  # the delimiter row
        out.append((section, first.strip("`")))
    return out


def _key_column(text: str) -> list[str]:
    return [key for _, key in _key_rows(text)]


# --------------------------------------------------------------------------------------------
# (1) the generated section is current


def test_generated_section_is_up_to_date() -> None:
    text = _doc()
    assert text.count(docs.BEGIN_MARKER) == 1, f"missing marker line {docs.BEGIN_MARKER!r}"
    assert text.count(docs.END_MARKER) == 1, f"missing marker line {docs.END_MARKER!r}"
    section = text.split(docs.BEGIN_MARKER, 1)[1].split(docs.END_MARKER, 1)[0]
    expected = docs.field_reference() + docs.gpu_model_table()
    assert section.strip("\n") == expected.strip("\n"), f"{DOC.name} is stale: {REGENERATE}"


def test_check_mode_flags_a_stale_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = tmp_path / "current.md"
    current.write_text(_doc(), encoding="utf-8")
    assert docs.main(["--check", str(current)]) == 0

    stale = tmp_path / "stale.md"
    stale.write_text(
        f"# cluster.yml\n\nprose\n\n{docs.BEGIN_MARKER}\nold table\n{docs.END_MARKER}\n\nafter\n",
        encoding="utf-8",
    )
    assert docs.main(["--check", str(stale)]) == 1
    assert "python -m gpuctl.config.docs" in capsys.readouterr().err
    assert docs.main([str(stale)]) == 0
    rewritten = stale.read_text(encoding="utf-8")
    assert rewritten.startswith("# cluster.yml\n\nprose\n\n")
    assert rewritten.endswith(f"{docs.END_MARKER}\n\nafter\n")
    assert "old table" not in rewritten
    assert docs.main(["--check", str(stale)]) == 0

    unmarked = tmp_path / "unmarked.md"
    unmarked.write_text("# no markers\n", encoding="utf-8")
    assert docs.main(["--check", str(unmarked)]) == 2


def test_generation_is_deterministic() -> None:
    assert docs.field_reference() == docs.field_reference()
    assert docs.gpu_model_table() == docs.gpu_model_table()


# --------------------------------------------------------------------------------------------
# (2) every field is documented, and the document names no field that does not exist


def test_every_field_path_is_in_the_doc() -> None:
    keys = set(_key_column(_doc()))
    missing = sorted(set(FIELDS) - keys)
    assert missing == [], f"fields missing from {DOC.name}: {missing}; {REGENERATE}"


def test_every_model_has_a_section() -> None:
    headings = set(_heading_paths(_doc()))
    missing = sorted(p for p in MODELS if p and p not in headings)
    assert missing == [], f"sections missing from {DOC.name}: {missing}; {REGENERATE}"


def test_doc_names_no_stale_paths() -> None:
    text = _doc()
    keys = _key_column(text)
    assert keys, f"no `{TABLE_HEADER}` table in {DOC.name}"
    stale_keys = sorted({k for k in keys if k not in FIELDS})
    stale_headings = sorted({h for h in _heading_paths(text) if h not in MODELS})
    assert stale_keys == [], f"{DOC.name} documents keys the model lacks: {stale_keys}"
    assert stale_headings == [], f"{DOC.name} has sections for no model: {stale_headings}"


def test_each_key_sits_under_its_own_section() -> None:
    """A row `node_groups[].gpus.model` belongs to the table under `### node_groups[].gpus`."""
    misplaced = [
        f"{key} under {section or 'a heading that is no key path'}"
        for section, key in _key_rows(_doc())
        if (key.rsplit(".", 1)[0] if "." in key else "") != section
    ]
    assert misplaced == []


def test_gpu_models_in_the_doc_match_the_catalog() -> None:
    assert [m.value for m in GpuModel] == list(gpu_specs())
    table = docs.gpu_model_table()
    for key in gpu_specs():
        assert f"| `{key}` |" in table


def test_complete_example_is_what_init_prints() -> None:
    """The prose promises the example is `gpuctl init -p hgx-h100`; keep that true."""
    text = _doc()
    after = text.split("## A complete example", 1)[1]
    block = after.split("```yaml\n", 1)[1].split("```\n", 1)[0]
    assert block == starter("hgx-h100"), (
        f"the example in {DOC.name} differs from `gpuctl init -p hgx-h100`: paste its output"
    )


# --------------------------------------------------------------------------------------------
# (3) every field carries a description (editors show it as hover text from the JSON schema)


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_field_has_a_description(path: str) -> None:
    description = FIELDS[path].description
    assert description is not None, f"{path} has no description= in gpuctl/config/model.py"
    assert description.strip(), f"{path} has an empty description"


@pytest.mark.parametrize("path", sorted(MODELS), ids=lambda p: p or "<root>")
def test_model_has_a_docstring(path: str) -> None:
    model = MODELS[path]
    doc = model.__dict__.get("__doc__")
    assert isinstance(doc, str), f"{model.__name__} ({path or 'top level'}) has no docstring"
    assert doc.strip()
