"""The JSON Schema of cluster.yml, for editors (yaml-language-server) and other tools."""

from __future__ import annotations

from typing import Any

from gpuctl.config.model import Cluster

SCHEMA_ID = "urn:gpuctl:schema:cluster:v1"


def json_schema() -> dict[str, Any]:
    schema = Cluster.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
    }
