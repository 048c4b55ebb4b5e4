#!/usr/bin/env bash
# RabbitMQ's Java stream client (com.rabbitmq:stream-client 1.2.0) against Warren's stream
# protocol, and against RabbitMQ 3.10 for reference: an interop check and a throughput figure.
# Not part of scripts/test.sh. See bench/stream-java/README.md.
#
#   bench/stream_java.sh          BROKERS="warren" (the default): a Warren started here on free
#                                 ports with a temp data dir (its stream protocol announces
#                                 version 3.13.0, so the Java client enables stream stats and
#                                 super streams). "warren-3.13" runs one with
#                                 [server_properties] version = "3.13.0" set in its config.
#   BROKERS="warren rabbitmq" bench/stream_java.sh
#     rabbitmq     RabbitMQ 3.10 on 127.0.0.1:$RABBITMQ_STREAM_PORT (5553); started with
#                  ../shared/bench/rabbitmq.sh if not up (and then stopped after)
# env: MESSAGES (200000), SIZE (bytes, 100), WARREN_BIN (target/release/warren), STREAM_JAVA_ARGS
#      (more flags for the program, e.g. "--super-messages 10000"), RABBITMQ_SH, RABBITMQ_STREAM_PORT,
#      KEEP=1 to keep Warren's data dir.
# RabbitMQ 3.10 has no stream stats, super streams made over the protocol, nor single active
# consumers (3.11+, 3.13): it is run with --no-super-stream --no-stream-stats.
# Output: one line per check and a summary per broker; logs (Warren's, the client's stderr) in a
# temp dir printed at the end. Exit status 1 if any check failed on any broker.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PROJ=$HERE/stream-java
JAR=$PROJ/target/stream-java.jar
BROKERS=${BROKERS:-warren}
MESSAGES=${MESSAGES:-200000}
SIZE=${SIZE:-100}
BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
RMQ_SH=${RABBITMQ_SH:-$ROOT/../shared/bench/rabbitmq.sh}
RMQ_STREAM_PORT=${RABBITMQ_STREAM_PORT:-5553}
LOGS=$(mktemp -d /tmp/stream-java-XXXXXX)
log() { echo "[stream_java.sh] $*" >&2; }

# The jar and target/lib/*.jar; offline once the dependencies are in ~/.m2.
newer=$(find "$PROJ/pom.xml" "$PROJ/src" -newer "$JAR" 2>/dev/null | head -1)
if [ ! -f "$JAR" ] || [ -n "$newer" ]; then
  log "building $JAR"
  (cd "$PROJ" && { mvn -q -o package 2>"$LOGS/mvn-offline.log" || mvn -q package; }) ||
    { log "mvn package failed"; exit 2; }
fi

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

WPID=""; WDATA=""; RMQ_STARTED=""
cleanup() {
  if [ -n "$WPID" ]; then kill "$WPID" 2>/dev/null; wait "$WPID" 2>/dev/null; fi
  [ -n "$WDATA" ] && [ "${KEEP:-0}" != 1 ] && rm -rf "$WDATA"
  [ -n "$RMQ_STARTED" ] && "$RMQ_SH" stop
}
trap cleanup EXIT

run_client() { # label port flags...
  local label=$1 p=$2; shift 2
  # shellcheck disable=SC2086
  java -jar "$JAR" --label "$label" --host 127.0.0.1 --port "$p" --user guest --password guest \
    --messages "$MESSAGES" --size "$SIZE" "$@" ${STREAM_JAVA_ARGS:-} 2>"$LOGS/$label-client.err" |
    tee "$LOGS/$label.out"
  return "${PIPESTATUS[0]}"
}

status=0
for broker in $BROKERS; do
  case $broker in
    warren|warren-3.13)
      [ -x "$BIN" ] || { log "no Warren binary at $BIN (cargo build --release -p warren)"; status=1; continue; }
      AMQP=$(port); HTTP=$(port); STREAM=$(port)
      WDATA=$(mktemp -d /tmp/warren-stream-java-XXXXXX)
      conf=()
      if [ "$broker" = warren-3.13 ]; then
        printf '[server_properties]\nversion = "3.13.0"\n' >"$WDATA/warren.toml"
        conf=(--config "$WDATA/warren.toml")
      fi
      "$BIN" server "${conf[@]}" --amqp-port "$AMQP" --http-port "$HTTP" --stream-port "$STREAM" \
        --data-dir "$WDATA/data" >"$LOGS/$broker.log" 2>&1 &
      WPID=$!
      for _ in $(seq 1 200); do up "$STREAM" && break; sleep 0.05; done
      up "$STREAM" || { log "Warren did not open $STREAM; see $LOGS/$broker.log"; status=1; continue; }
      log "Warren $("$BIN" --version 2>/dev/null) pid $WPID, stream port $STREAM, data $WDATA"
      run_client "$broker" "$STREAM" || status=1
      kill "$WPID" 2>/dev/null; wait "$WPID" 2>/dev/null; WPID=""
      [ "${KEEP:-0}" = 1 ] || rm -rf "$WDATA"
      ;;
    rabbitmq)
      if ! up "$RMQ_STREAM_PORT"; then
        [ -x "$RMQ_SH" ] || { log "RabbitMQ not on $RMQ_STREAM_PORT and no $RMQ_SH"; status=1; continue; }
        "$RMQ_SH" start || { status=1; continue; }
        RMQ_STARTED=1
      fi
      run_client rabbitmq "$RMQ_STREAM_PORT" --no-super-stream --no-stream-stats || status=1
      ;;
    *) log "unknown broker '$broker' (warren, warren-3.13, rabbitmq)"; status=1 ;;
  esac
done

echo
echo "rates ($MESSAGES messages of $SIZE bytes, one producer with confirms, one consumer from first):"
for broker in $BROKERS; do
  [ -f "$LOGS/$broker.out" ] && grep '^summary ' "$LOGS/$broker.out"
done
echo "logs: $LOGS"
exit "$status"
