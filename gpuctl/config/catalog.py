"""Typed access to the hardware catalog in ``gpuctl/data`` (GPU models, fabric rates, health)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuctl.resources import load_data


@dataclass(frozen=True, slots=True)
class GpuSpec:
    key: str
    product_name: str
    architecture: str
    form_factor: str
    memory_gib: int
    pcie_gen: int
    nvswitch_gpus: int | None
    nvlink_per_pair: str | None
    interconnects: tuple[str, ...]
    max_per_node: int
    open_modules: str
    gres_type: str
    min_driver: str | None
    thresholds: dict[str, float | None]
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RateSpec:
    rates: tuple[int, ...]
    ib_write_bw_gbps: dict[int, float]
    derived: bool


@cache
def gpu_specs() -> dict[str, GpuSpec]:
    raw: dict[str, dict[str, Any]] = load_data("gpu_models.yml")
    return {
        key: GpuSpec(
            key=key,
            product_name=str(v["product_name"]),
            architecture=str(v["architecture"]),
            form_factor=str(v["form_factor"]),
            memory_gib=int(v["memory_gib"]),
            pcie_gen=int(v["pcie_gen"]),
            nvswitch_gpus=v["nvswitch_gpus"],
            nvlink_per_pair=v["nvlink_per_pair"],
            interconnects=tuple(v["interconnects"]),
            max_per_node=int(v["max_per_node"]),
            open_modules=str(v["open_modules"]),
            gres_type=str(v["gres_type"]),
            min_driver=None if v["min_driver"] is None else str(v["min_driver"]),
            thresholds=dict(v["thresholds"]),
            sources=tuple(v["sources"]),
        )
        for key, v in raw.items()
    }


def gpu_spec(model: str) -> GpuSpec:
    return gpu_specs()[model]


@cache
def ib_rates() -> dict[str, RateSpec]:
    raw: dict[str, dict[str, Any]] = load_data("fabrics.yml")["infiniband"]
    return {gen: _rate_spec(v) for gen, v in raw.items()}


@cache
def roce_rates() -> RateSpec:
    return _rate_spec(load_data("fabrics.yml")["roce"])


def _rate_spec(v: dict[str, Any]) -> RateSpec:
    return RateSpec(
        rates=tuple(int(r) for r in v["rates"]),
        ib_write_bw_gbps={int(k): float(x) for k, x in v["ib_write_bw_gbps"].items()},
        derived=bool(v["derived"]),
    )


@cache
def health_defaults() -> dict[str, Any]:
    return dict(load_data("health.yml"))
