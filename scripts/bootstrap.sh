#!/usr/bin/env bash
# Set up what gpuctl (and with --test, its tests) need, on a fresh Debian 12 machine as root
# (idempotent):
# Debian packages, then a virtualenv in .venv with the locked Python dependencies
# (requirements/dev.lock, hash-checked) and gpuctl itself installed editable.
set -euo pipefail
cd "$(dirname "$0")/.."

# --lab: also what the lab needs (debootstrap, systemd-nspawn, iproute2, apt-cacher-ng as the
#        nodes' apt proxy, dpkg-dev for the lab repository's index tools, git for its nccl-tests
#        mirror)
# --test: the lab's packages and what the tests' real consumers need (promtool from prometheus,
#         headless Chromium, openssh-server for benchmarks/sshnodes.py's sshd-only nodes)
packages=(python3 python3-venv python3-pip openssh-client ca-certificates)
case "${1:-}" in
  --lab) packages+=(debootstrap systemd-container iproute2 apt-cacher-ng dpkg-dev git) ;;
  --test) packages+=(debootstrap systemd-container iproute2 apt-cacher-ng dpkg-dev git prometheus chromium fonts-dejavu-core openssh-server) ;;
esac

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=()
  for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
  done
  if [ "${#need[@]}" -gt 0 ]; then
    echo "bootstrap: installing Debian packages: ${need[*]}"
    apt-get update -q
    # never start services while installing (the prometheus package would start a server, and
    # apt-cacher-ng its system proxy: the lab runs its own, bound to the lab bridge only)
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
    if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi
  fi
fi

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  echo "bootstrap: gpuctl needs Python 3.11 (ansible-core 2.19); $PYTHON is $("$PYTHON" -V 2>&1)" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# pip, with its output shown only on failure (some machines' pip.conf adds noisy find-links)
quiet_pip() {
  local out
  if ! out="$(.venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1)"; then
    printf '%s\n' "$out" >&2
    return 1
  fi
}

stamp=.venv/.gpuctl-lock.sha256
want="$(sha256sum requirements/dev.lock pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing locked Python dependencies into .venv"
  quiet_pip --require-hashes --no-deps -r requirements/dev.lock
  quiet_pip --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
