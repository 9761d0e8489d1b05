"""Typed access to the hardware catalog in ``gpuctl/data`` (GPU models, fabric rates, health,
physical limits)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    nvlink_gbs: float | None = None  # NVLink bandwidth per GPU, both directions (datasheet)
    nvlink_source: str | None = None
    # the NVLink board without NVSwitch: (GPUs on it, topo -m token of every pair); None: none
    nvlink_board: tuple[int, str] | None = None
    nvlink_bridge: str | None = None  # the topo -m token of a bridged pair; None: no bridges


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
            nvlink_gbs=None if v.get("nvlink_gbs") is None else float(v["nvlink_gbs"]),
            nvlink_source=None if v.get("nvlink_source") is None else str(v["nvlink_source"]),
            nvlink_board=None
            if v.get("nvlink_board") is None
            else (int(v["nvlink_board"]["gpus"]), str(v["nvlink_board"]["per_pair"])),
            nvlink_bridge=None if v.get("nvlink_bridge") is None else str(v["nvlink_bridge"]),
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


@dataclass(frozen=True, slots=True)
class CounterRules:
    """What growth of an error counter means (data/counters.yml): a counter whose key holds one
    of ``fail`` FAILs when it grows; one that holds one of ``warn`` WARNs (``warn`` None: every
    other counter WARNs; else the rest, data counters, are not judged). A first read at a
    saturated value (any counter at one of ``saturated``, or a counter at its own width's
    maximum, ``saturated_at``) cannot grow any more."""

    fail: tuple[str, ...]
    warn: tuple[str, ...] | None
    saturated: frozenset[int]
    saturated_at: Mapping[str, int]
    source: str

    def verdict_of(self, key: str) -> str | None:
        """``"fail"``, ``"warn"`` or None (not judged) for counter ``key``."""
        if any(word in key for word in self.fail):
            return "fail"
        if self.warn is None or any(word in key for word in self.warn):
            return "warn"
        return None

    def is_saturated(self, key: str, value: int) -> bool:
        return value in self.saturated or self.saturated_at.get(key) == value


@cache
def counter_rules(family: str) -> CounterRules:
    """The rules of one counter family of data/counters.yml (``nvlink``, ``infiniband``)."""
    spec = load_data("counters.yml")[family]
    warn = spec.get("warn_on_growth")
    return CounterRules(
        fail=tuple(str(w) for w in spec["fail_on_growth"]),
        warn=None if warn is None else tuple(str(w) for w in warn),
        saturated=frozenset(int(v) for v in spec.get("saturated") or ()),
        saturated_at={str(k): int(v) for k, v in (spec.get("saturated_at") or {}).items()},
        source=str(spec["source"]),
    )


@cache
def nvlink_crc_fail_per_second() -> float:
    """NVLink CRC errors per second that FAIL a link (DCGM's NVLink health watch)."""
    return float(load_data("counters.yml")["nvlink"]["crc_fail_per_second"])


@cache
def ber_limit() -> tuple[float, str]:
    """The most bit errors per bit a link may show after its corrections, and its source
    (data/counters.yml ``ber``)."""
    spec = load_data("counters.yml")["ber"]
    return float(spec["max"]), str(spec["source"])


@cache
def default_fatal_xids() -> tuple[int, ...]:
    """The Xids that fail a node unless cluster.yml sets xid_fatal: every Xid of data/xid.yml
    whose action is not `monitor` (isolate, reboot, reset), in order."""
    actions = load_data("xid.yml")["actions"]
    return tuple(
        sorted(int(x) for action, xids in actions.items() if action != "monitor" for x in xids)
    )


# ------------------------------------------------------------------------------------------
# Physical ceilings: what no measurement of a link can exceed (gpuctl/data/limits.yml)


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The most a link can carry, in the unit of the measurement judged against it."""

    value: float
    what: str  # "NVLink of h100-sxm (both directions)", "the port's line rate"
    source: str


@cache
def _limits() -> dict[str, Any]:
    return dict(load_data("limits.yml"))


@cache
def ceiling_tolerance() -> float:
    """How far above its ceiling a measurement may read before it is a lie (limits.yml)."""
    return float(_limits()["ceiling_tolerance"])


@cache
def pcie_lane_gbs() -> dict[int, float]:
    """PCIe throughput per lane and direction, GB/s, by generation (limits.yml)."""
    return {int(k): float(v) for k, v in _limits()["pcie_lane_gbs"].items()}


def pcie_ceiling(gen: int, width: int) -> Ceiling | None:
    """A PCIe link's bandwidth per direction (host-to-device or device-to-host copies), GB/s;
    None for a generation limits.yml has no number for."""
    lane = pcie_lane_gbs().get(gen)
    if lane is None or width <= 0:
        return None
    return Ceiling(
        round(lane * width, 3),
        f"PCIe Gen{gen} x{width} (per direction)",
        "PCI-SIG base specifications (data/limits.yml)",
    )


@cache
def busbw_ceiling(model: str | None) -> Ceiling | None:
    """The most a single-node nccl-tests busbw can reach, GB/s: the GPU's NVLink bandwidth, or
    for a GPU without NVLink its x16 PCIe link, both directions (in-switch reduction, NVLS,
    lets busbw exceed one direction; no algorithm exceeds both). The model's NVLink counts even
    where cluster.yml says the GPUs are not bridged: a ceiling must never fail real hardware.
    An unknown model gets the fastest GPU gpuctl knows."""
    specs = gpu_specs()
    spec = specs.get(model) if model is not None else None
    if spec is None:
        found = [c for key in specs if (c := busbw_ceiling(key)) is not None]
        best = max(found, key=lambda c: c.value, default=None)
        if best is None:
            return None
        return Ceiling(best.value, f"the fastest GPU gpuctl knows: {best.what}", best.source)
    if spec.nvlink_gbs is not None:
        what = f"NVLink of {spec.key} (both directions)"
        return Ceiling(spec.nvlink_gbs, what, f"{spec.nvlink_source} (data/gpu_models.yml)")
    pcie = pcie_ceiling(spec.pcie_gen, 16)
    if pcie is None:
        return None
    what = f"the PCIe Gen{spec.pcie_gen} x16 link of {spec.key} (both directions)"
    return Ceiling(round(2 * pcie.value, 3), what, pcie.source)


def nvlink_ceiling(model: str | None) -> Ceiling | None:
    """The most one GPU can copy to or from a peer over NVLink, GB/s: half the model's NVLink
    bandwidth (the datasheet gives both directions together). None without NVLink or model."""
    spec = gpu_specs().get(model) if model is not None else None
    if spec is None or spec.nvlink_gbs is None:
        return None
    return Ceiling(
        spec.nvlink_gbs / 2,
        f"NVLink of {spec.key}, one direction",
        f"{spec.nvlink_source} (data/gpu_models.yml)",
    )


@cache
def fastest_rate(kind: str | None) -> int:
    """The fastest port rate in fabrics.yml for ``infiniband`` or ``roce`` (None: either)."""
    ib = [r for spec in ib_rates().values() for r in spec.rates]
    roce = list(roce_rates().rates)
    rates = ib if kind == "infiniband" else roce if kind == "roce" else ib + roce
    return max(rates)


def port_ceiling(rate_gbps: float, what: str = "the port's line rate") -> Ceiling:
    """An RDMA port's line rate, Gb/s: what ib_write_bw can reach in one direction."""
    return Ceiling(float(rate_gbps), what, "ibstat Rate / fabrics.yml (data/limits.yml)")


def multinode_busbw_ceiling(
    rates_gbps: Sequence[float], gpu_model: str | None = None
) -> Ceiling | None:
    """The most a multi-node nccl-tests busbw can reach, GB/s: what the node's NICs carry in
    both directions (their line rates added up, Gb/s / 8); None without a rate. Given the GPU
    model, never less than its NVLink (an NVLink domain across nodes, an NVLink Switch system,
    carries the traffic there)."""
    rates = [float(r) for r in rates_gbps if r]
    if not rates:
        return None
    each = (
        f"{len(rates)} x {rates[0]:g}"
        if len(set(rates)) == 1
        else "+".join(f"{r:g}" for r in rates)
    )
    nics = Ceiling(
        round(2 * sum(rates) / 8.0, 3),
        f"the node's NICs ({each} Gb/s, both directions)",
        "NIC line rates (cluster.yml, data/fabrics.yml); data/limits.yml",
    )
    nvlink = busbw_ceiling(gpu_model) if gpu_model is not None else None
    return nvlink if nvlink is not None and nvlink.value > nics.value else nics
