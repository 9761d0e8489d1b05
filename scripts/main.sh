#!/usr/bin/env bash
# The main job on the lab (as root): set up, start a 3-node lab (systemd-nspawn nodes on a
# private bridge; builds the cached Debian 12 image the first time), then check and render the
# running lab's cluster.yml into out/lab (inventory, ansible.cfg, Slurm files). The lab stays up:
# `.venv/bin/gpuctl lab status`, `gpuctl lab ssh gpu001`, `gpuctl lab down`.
# Provisioning and validating the lab come with the provisioning and validate issues.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --lab
.venv/bin/gpuctl lab up --nodes "${GPUCTL_LAB_NODES:-3}"
cluster="${GPUCTL_LAB_DIR:-/var/lib/gpuctl-lab}/cluster.yml"
.venv/bin/gpuctl check "$cluster"
.venv/bin/gpuctl render "$cluster" -o out/lab
.venv/bin/gpuctl lab ssh gpu001 -- systemctl is-system-running
echo "main: the lab is up; rendered its cluster.yml into out/lab"
