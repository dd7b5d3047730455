#!/usr/bin/env bash
# Debian packages the harness and its tests need: sshd and iproute2/iptables for test
# hosts, redis-server for the embedded cluster's GCS fault tolerance (head-loss suites),
# chromium for the report's browser test, sudo for the foreign-cluster stand-in's login users
# that escalate through it (ssh.become).  Idempotent; needs root (CI runs as root).
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v sudo >/dev/null 2>&1 || need+=(sudo)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-system: missing ${need[*]}; install them as root (apt-get install -y ${need[*]})" >&2
    exit 0
  fi
  echo "setup-system: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
