"""Judges: parsed tool output + what cluster.yml expects -> CheckResults.

One module per check family; each node judge declares itself with the probe kinds it reads
(:func:`gpuctl.validation.judges.base.node_judge`) and applies to a node where a probe of such
a kind runs (the probe table, :mod:`gpuctl.validation.probes`). :data:`NODE_JUDGES` is the
registry :func:`gpuctl.validation.suite.judge_node` runs, each judge called the same way
(the node's expectation and its :class:`~gpuctl.validation.judges.base.Evidence`); its order
is the order of a node's results in every report. The fleet-relative judge
(:mod:`gpuctl.validation.judges.fleet`) runs once over every node's results, the golden-config
comparison (:mod:`gpuctl.validation.judges.consistency`) once over every node's facts.
"""

from __future__ import annotations

from gpuctl.validation.judges import (
    burn,
    consistency,
    counters,
    dcgm,
    fabric_manager,
    gpudirect,
    gpus,
    infiniband,
    latency,
    nccl,
    node,
    nvlink,
    p2p,
    pci,
    pcie,
    phy,
    topology,
    xid,
)
from gpuctl.validation.judges.base import Judge

NODE_JUDGES: tuple[Judge, ...] = (
    gpus.judge_gpus,
    topology.judge_topology,
    topology.judge_p2p_capability,
    nccl.judge_nccl,
    nccl.judge_nccl_collectives,
    pcie.judge_pcie_copies,
    p2p.judge_p2p_copies,
    infiniband.judge_ib_ports,
    xid.judge_xid_in_window,
    pcie.judge_pcie_aer,
    pcie.judge_iommu,
    pci.judge_pcie_acs,
    pci.judge_nic_links,
    fabric_manager.judge_fabric_manager,
    dcgm.judge_dcgm,
    nvlink.judge_nvlink_status,
    nvlink.judge_nvlink_errors,
    infiniband.judge_ib_write_bw_pairs,
    latency.judge_ib_write_lat_pairs,
    gpudirect.judge_gpudirect,
    counters.judge_ib_port_errors,
    counters.judge_roce_port_errors,
    phy.judge_link_phy,
    consistency.judge_config_probes,
    node.judge_node_resources,
    node.judge_mounts,
    node.judge_clock,
    node.judge_hugepages,
    burn.judge_burn,
)
