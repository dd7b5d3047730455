#!/usr/bin/env bash
# Start a Ray cluster on machines over SSH, the way a team starts one on its VMs: for each
# node a service unit on the node's own disk (`ray start --block`, restarted 2 s after it
# exits, as systemd's Restart=always does), started now and at every boot.  Nothing of the
# harness is used on the nodes: their own Python and Ray (NODE_PYTHON), their own /tmp.
#
#   scripts/foreign-ray-start.sh -i KEY -k KNOWN_HOSTS HEAD_IP WORKER_IP...
#
# The foreign-cluster stand-in (chaos/embedded/foreign.py) runs it against its test hosts;
# the unit's own settings (health checks tuned for fast detection, a 10 s drain window) are
# what a team tunes for its cluster, written here where a team writes them.
set -euo pipefail

key="" known=""
while getopts "i:k:" opt; do
  case "$opt" in
    i) key=$OPTARG ;;
    k) known=$OPTARG ;;
    *) echo "usage: $0 -i KEY -k KNOWN_HOSTS HEAD_IP WORKER_IP..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ -n "$key" ] && [ -n "$known" ] && [ $# -ge 2 ] || { echo "usage: $0 -i KEY -k KNOWN_HOSTS HEAD_IP WORKER_IP..." >&2; exit 2; }
head=$1; shift

NODE_PYTHON=${NODE_PYTHON:-/opt/ray/bin/python}
GCS_PORT=${GCS_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
SSH=(ssh -i "$key" -o UserKnownHostsFile="$known" -o StrictHostKeyChecking=yes -o BatchMode=yes
     -o ConnectTimeout=10 -o IdentitiesOnly=yes)

unit() {  # unit IP RAY_START_ARGS...: the node's service, on its own disk (/opt/node)
  local ip=$1; shift
  cat <<EOF
#!/bin/sh
# ray.service of $ip (written by foreign-ray-start.sh): Restart=always, RestartSec=2
export PATH=$(dirname "$NODE_PYTHON"):/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 GLOO_SOCKET_IFNAME=eth0 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
export RAY_health_check_period_ms=500 RAY_health_check_timeout_ms=1000 RAY_health_check_failure_threshold=3
export RAY_health_check_initial_delay_ms=1000 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=10
export LD_LIBRARY_PATH=/opt/cuda/lib64
while :; do
  $NODE_PYTHON -m ray.scripts.scripts start --block --node-ip-address=$ip --object-store-memory=157286400 $*
  echo "ray start exited \$?; restarting in 2 s"
  sleep 2
done
EOF
}

install() {  # install IP ARGS...: write the unit over SSH and start it (systemctl enable --now)
  local ip=$1; shift
  unit "$ip" "$@" | "${SSH[@]}" "root@$ip" \
    'mkdir -p /opt/node && cat > /opt/node/ray.service && chmod +x /opt/node/ray.service &&
     { setsid nohup /opt/node/ray.service >> /opt/node/ray.log 2>&1 < /dev/null & } && echo "started on $(hostname)"'
}

install "$head" --head "--port=$GCS_PORT" --dashboard-host=0.0.0.0 "--dashboard-port=$DASHBOARD_PORT" --num-cpus=0
for ip in "$@"; do
  install "$ip" "--address=$head:$GCS_PORT" --num-cpus=1
done
