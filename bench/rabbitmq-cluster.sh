#!/usr/bin/env bash
# Run a 3-node stock RabbitMQ 3.10 cluster (Debian's rabbitmq-server package) on loopback, as the
# reference for bench/cluster.sh's cluster scenarios:
#
#   bench/rabbitmq-cluster.sh start && EXTERNAL=1 BASE=5690 bench/cluster.sh; bench/rabbitmq-cluster.sh stop
#
#   rabbitmq-cluster.sh start    install if missing, start rabbit-c1..c3@localhost, join c2 and c3 to
#                                c1 (stop_app; reset; join_cluster; start_app), wait until c1's
#                                cluster_status shows 3 running nodes, print the AMQP URIs
#   rabbitmq-cluster.sh stop     stop the three nodes (rabbitmqctl stop, else kill) and delete DIR
#   rabbitmq-cluster.sh status   each node's state and the running nodes c1 sees (exit 1 unless all up)
#   rabbitmq-cluster.sh ctl N ARGS   rabbitmqctl ARGS against node N (1..3)
#
# Ports (BASE defaults to 5690; node N = 1..3), all on 127.0.0.1:
#   AMQP          BASE+N         5691-5693   guest/guest (loopback only, RabbitMQ's default)
#   distribution  BASE+20000+N  25691-25693   (epmd on 127.0.0.1:4369, shared; CLI tools 35672-35682)
#   management    BASE+10000+N  15691-15693   only with MGMT=1. Off by default: its stats
#                 collection and DB cost CPU on every node (the 2 shared cores) and bench/cluster.sh
#                 does not use it. 15693 is also the prometheus port of rabbit-bench (the single node).
# Each node has its own config, enabled-plugins file, mnesia, logs and pid file under
# DIR/cN (DIR=${RABBITMQ_CLUSTER_DIR:-/tmp/rabbitmq-cluster}, owned by rabbitmq); `start` wipes
# DIR when no node is up, so every start is a fresh cluster. The nodes run as user rabbitmq like
# /work/shared/bench/rabbitmq.sh's single node (rabbit-bench@localhost, 5673/15673/25673), which this leaves
# alone, and share its Erlang cookie (/var/lib/rabbitmq/.erlang.cookie).
# RABBITMQ_CLUSTER_ERL_ARGS adds emulator flags to every node, e.g. "+sbwt none +sbwtdcpu none
# +sbwtdio none" to stop idle schedulers busy-waiting when 3 nodes share few cores (default: stock).
# Memory: each node takes ~130 MB RSS idle, but unthrottled producers build backlogs of millions
# of messages (GBs) in seconds; RABBITMQ_CLUSTER_MEM (default 2GB) is each node's
# vm_memory_high_watermark.absolute: above it a node blocks publishers cluster-wide, above half
# of it queues page messages to disk under DIR. Starting takes ~20-30 s on 2 cores.
set -u -o pipefail
BASE=${BASE:-5690}
DIR=${RABBITMQ_CLUSTER_DIR:-/tmp/rabbitmq-cluster}
MGMT=${MGMT:-0}
MEM=${RABBITMQ_CLUSTER_MEM:-2GB}
TIMEOUT=${RABBITMQ_CLUSTER_TIMEOUT:-120}
NODES=(1 2 3)
export ERL_EPMD_ADDRESS=127.0.0.1

log() { echo "[rabbitmq-cluster.sh] $*" >&2; }
node() { echo "rabbit-c$1@localhost"; }
amqp_port() { echo $((BASE + $1)); }
mgmt_port() { echo $((BASE + 10000 + $1)); }
dist_port() { echo $((BASE + 20000 + $1)); }
uri() { echo "amqp://guest:guest@127.0.0.1:$(amqp_port "$1")/%2f"; }
pidfile() { echo "$DIR/c$1/beam.pid"; }

env_of() { # N: the environment of node N's server and CLI tools
  local d="$DIR/c$1"
  ENV=(HOME=/var/lib/rabbitmq RABBITMQ_NODENAME="$(node "$1")"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$(amqp_port "$1")"
    RABBITMQ_DIST_PORT="$(dist_port "$1")" ERL_EPMD_ADDRESS=127.0.0.1
    RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins"
    RABBITMQ_MNESIA_BASE="$d/mnesia" RABBITMQ_LOG_BASE="$d/log" RABBITMQ_PID_FILE="$(pidfile "$1")"
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1} ${RABBITMQ_CLUSTER_ERL_ARGS:-}"
    "RABBITMQ_CTL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}")
}
rmq() { # N TOOL ARGS: a RabbitMQ CLI tool against node N, as rabbitmq
  local n=$1 tool=$2; shift 2; env_of "$n"
  (cd /var/lib/rabbitmq && runuser -u rabbitmq -- env "${ENV[@]}" /usr/lib/rabbitmq/bin/"$tool" -n "$(node "$n")" "$@"); }
pinged() { rmq "$1" rabbitmq-diagnostics -q ping >/dev/null 2>&1; }
amqp_open() { (exec 3<>/dev/tcp/127.0.0.1/"$(amqp_port "$1")") 2>/dev/null; }
up() { pinged "$1" && amqp_open "$1"; }
running_nodes() { # the running nodes c1's cluster_status lists, one a line
  rmq 1 rabbitmqctl -q cluster_status --formatter json 2>/dev/null |
    grep -oE '"running_nodes":\[[^]]*\]' | grep -oE 'rabbit-c[0-9]+@localhost' | sort -u; }
clustered() { [ "$(running_nodes | wc -l)" -eq 3 ]; }

install() {
  dpkg -s rabbitmq-server >/dev/null 2>&1 && return 0
  log "installing rabbitmq-server (Debian package)"
  apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server >/dev/null
}

port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

show_logs() { # N: the tail of node N's output and logs
  local f
  for f in "$DIR/c$1/server.out" "$DIR/c$1"/log/*.log; do
    [ -s "$f" ] || continue
    echo "----- $f (last 30 lines) -----" >&2; tail -n 30 "$f" >&2
  done
}
fail() { # N MESSAGE: say why, show node N's logs, tear the cluster down
  log "node $(node "$1"): $2"
  show_logs "$1"
  log "stopping the cluster (KEEP_ON_FAIL=1 keeps it and $DIR for inspection)"
  [ "${KEEP_ON_FAIL:-0}" = 1 ] || stop >/dev/null 2>&1
  exit 1
}

launch() { # N: start node N in the background, in its own session
  local n=$1 d="$DIR/c$1"
  mkdir -p "$d/mnesia" "$d/log"
  { echo "listeners.tcp.default = 127.0.0.1:$(amqp_port "$n")"
    echo "loopback_users.guest = true"
    echo "log.file.level = info"
    if [ "$MGMT" = 1 ]; then
      echo "management.tcp.ip = 127.0.0.1"
      echo "management.tcp.port = $(mgmt_port "$n")"
    fi
    # Stock is 0.4 of RAM per node: 3 nodes would allow 3 x 0.4 x RAM, more than the machine has.
    echo "vm_memory_high_watermark.absolute = $MEM"
  } >"$d/rabbitmq.conf"
  if [ "$MGMT" = 1 ]; then echo '[rabbitmq_management].' >"$d/enabled_plugins"; else echo '[].' >"$d/enabled_plugins"; fi
  chown -R rabbitmq:rabbitmq "$d"
  env_of "$n"
  # Debian's unit sets LimitNOFILE=65536; without it RabbitMQ stops accepting at ~830 connections.
  # setsid: the launcher's pid is the node's process group, which `stop` kills if all else fails.
  ( cd /var/lib/rabbitmq
    setsid runuser -u rabbitmq -- env "${ENV[@]}" /bin/sh -c \
      "ulimit -n 65536 2>/dev/null || ulimit -n \$(ulimit -Hn); umask 0027; exec /usr/lib/rabbitmq/bin/rabbitmq-server" \
      >"$d/server.out" 2>&1 </dev/null &
    echo $! >"$d/launcher.pgid" )
}

alive() { local g; g=$(cat "$DIR/c$1/launcher.pgid" 2>/dev/null) && kill -0 -- "-$g" 2>/dev/null; }

wait_up() { # N DEADLINE(epoch s)
  until up "$1"; do
    alive "$1" || fail "$1" "exited while starting"
    [ "$(date +%s)" -lt "$2" ] || fail "$1" "not up after ${TIMEOUT}s"
    sleep 1
  done
}

print_uris() {
  local n
  for n in "${NODES[@]}"; do uri "$n"; done
  log "cluster of $(running_nodes | tr '\n' ' ')up; management: $([ "$MGMT" = 1 ] && echo "http://127.0.0.1:$(mgmt_port 1)-$(mgmt_port 3)" || echo off)"
}

start() {
  install || { log "could not install rabbitmq-server"; exit 1; }
  local n any=0 all=1 had_epmd=0
  epmd -names >/dev/null 2>&1 && had_epmd=1 # before any CLI call, which starts epmd
  for n in "${NODES[@]}"; do if pinged "$n"; then any=1; else all=0; fi; done
  if [ $all = 1 ] && clustered; then log "already up"; print_uris; return 0; fi
  if [ $any = 1 ]; then
    log "some nodes are up but the cluster is not complete:"; status >&2
    log "run '$0 stop' first"; exit 1
  fi
  for n in "${NODES[@]}"; do
    for p in "$(amqp_port "$n")" "$(dist_port "$n")" $([ "$MGMT" = 1 ] && mgmt_port "$n"); do
      port_busy "$p" && { log "port 127.0.0.1:$p is already in use:"; ss -Hltnp "sport = :$p" >&2; exit 1; }
    done
  done
  # Leftovers of an earlier run (a node that died, or one this script never finished starting).
  for n in "${NODES[@]}"; do alive "$n" && { log "node $(node "$n") has processes but does not answer; run '$0 stop' first"; exit 1; }; done
  rm -rf "$DIR"; mkdir -p "$DIR"; chmod 755 "$DIR"
  [ $had_epmd = 1 ] || touch "$DIR/started-epmd"
  local t0 deadline; t0=$(date +%s); deadline=$((t0 + TIMEOUT))
  # One at a time: three cold boots at once on 2 cores is no faster and makes the timeout flaky.
  for n in "${NODES[@]}"; do
    launch "$n"; deadline=$(($(date +%s) + TIMEOUT)); wait_up "$n" "$deadline"
    log "$(node "$n") up after $(($(date +%s) - t0))s"
  done
  for n in 2 3; do # their CLI output (harmless feature-flag warnings and errors) goes to cN/join.out
    { rmq "$n" rabbitmqctl stop_app && rmq "$n" rabbitmqctl reset &&
      rmq "$n" rabbitmqctl join_cluster "$(node 1)" && rmq "$n" rabbitmqctl start_app
    } >"$DIR/c$n/join.out" 2>&1 || { tail -n 30 "$DIR/c$n/join.out" >&2; fail "$n" "could not join $(node 1)"; }
  done
  deadline=$(($(date +%s) + TIMEOUT))
  until clustered; do
    [ "$(date +%s)" -lt "$deadline" ] || { rmq 1 rabbitmqctl cluster_status >&2; fail 1 "cluster_status does not show 3 running nodes after ${TIMEOUT}s"; }
    sleep 1
  done
  for n in "${NODES[@]}"; do wait_up "$n" "$deadline"; done
  log "clustered after $(($(date +%s) - t0))s"
  print_uris
}

stop() {
  [ -d "$DIR" ] || { log "not running ($DIR does not exist)"; return 0; }
  local n pid g
  for n in 3 2 1; do # node 1 last: the others leave a running cluster instead of waiting for it
    pid=$(cat "$(pidfile "$n")" 2>/dev/null)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      rmq "$n" rabbitmqctl -q -t 60 stop "$(pidfile "$n")" >/dev/null 2>&1 ||
        log "rabbitmqctl stop failed for $(node "$n"); killing it"
    fi
    g=$(cat "$DIR/c$n/launcher.pgid" 2>/dev/null)
    if [ -n "$g" ] && kill -0 -- "-$g" 2>/dev/null; then
      kill -TERM -- "-$g" 2>/dev/null
      for _ in $(seq 1 20); do kill -0 -- "-$g" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$g" 2>/dev/null
    fi
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
    log "$(node "$n") stopped"
  done
  # epmd outlives the nodes; stop it only if this script started it and no node is left on it.
  if [ -f "$DIR/started-epmd" ] && ! epmd -names 2>/dev/null | grep -q '^name '; then epmd -kill >/dev/null 2>&1; fi
  rm -rf "$DIR"
}

status() {
  local n rc=0 state
  [ -d "$DIR" ] || { for n in "${NODES[@]}"; do echo "$(node "$n"): down"; done; return 1; }
  for n in "${NODES[@]}"; do
    if up "$n"; then state="up (amqp $(amqp_port "$n"), beam pid $(cat "$(pidfile "$n")" 2>/dev/null))"
    elif pinged "$n"; then state="node up, rabbit app stopped (amqp $(amqp_port "$n") closed)"; rc=1
    elif alive "$n"; then state="starting or hung (processes but no answer)"; rc=1
    else state=down; rc=1; fi
    echo "$(node "$n"): $state"
  done
  if pinged 1; then echo "running nodes seen by $(node 1): $(running_nodes | tr '\n' ' ')"; fi
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  ctl) shift; n=${1:?node number}; shift; rmq "$n" rabbitmqctl "$@" ;;
  *) echo "usage: $0 start|stop|status|ctl N ARGS" >&2; exit 2 ;;
esac
