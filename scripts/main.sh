#!/usr/bin/env bash
# The main job, for now: set up, check and render the example HGX H100 cluster into
# out/hgx-h100-ndr (Ansible inventory, ansible.cfg, slurm.conf, gres.conf, cgroup.conf,
# topology.conf). The lab issue turns this into provisioning and validating the lab cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
cluster="${1:-inventories/hgx-h100-ndr.yml}"
out="${2:-out/$(basename "$cluster" .yml)}"
.venv/bin/gpuctl check "$cluster"
.venv/bin/gpuctl render "$cluster" -o "$out"
echo "main: rendered $cluster into $out"
