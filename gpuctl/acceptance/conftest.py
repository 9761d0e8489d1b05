"""The suite's fixtures come from gpuctl.acceptance.plugin; load it unless ``-p`` already did."""

from __future__ import annotations

import pytest

PLUGIN = "gpuctl.acceptance.plugin"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)
