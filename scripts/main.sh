#!/usr/bin/env bash
# The main job on the lab (as root): set up, start a 3-node lab (systemd-nspawn nodes on a
# private bridge; builds the cached Debian 12 image the first time), check and render the
# running lab's cluster.yml into out/lab, then provision it with `gpuctl provision` (real
# Ansible over SSH: NVIDIA stand-in packages from the lab repository, munge and Slurm from
# Debian), and end with `gpuctl validate --level standard` of the provisioned lab (the lab's
# GPUs and InfiniBand are simulated: docs/lab.md). The lab stays up: `.venv/bin/gpuctl lab status`, `gpuctl lab ssh ctl01 -- sinfo`,
# `gpuctl logs --state-dir out/lab-runs`, `gpuctl lab down`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --lab
.venv/bin/gpuctl lab up --nodes "${GPUCTL_LAB_NODES:-3}"
cluster="${GPUCTL_LAB_DIR:-/var/lib/gpuctl-lab}/cluster.yml"
.venv/bin/gpuctl check "$cluster"
.venv/bin/gpuctl render "$cluster" -o out/lab
.venv/bin/gpuctl provision "$cluster" --state-dir out/lab-runs
.venv/bin/gpuctl lab ssh ctl01 -- sinfo -N
.venv/bin/gpuctl validate "$cluster" --level standard --out "out/lab-validate/$(date -u +%Y%m%dT%H%M%SZ)" \
  --html out/lab-validate/report.html --junit out/lab-validate/junit.xml
echo "main: the lab is up, provisioned and validated; runs in out/lab-runs, report in out/lab-validate"
