#!/usr/bin/env bash
# bench/lanes.sh: what lanes cost the relay binary (bounded; 127.0.0.1 only).
#
#   bench/lanes.sh idle   [--keys 10000] [--bin RELAY] [relay flags...]
#       --keys new api_keys, one 1-event request each (one lane each), then,
#       once every lane is delivered and idle: the relay's heap, stacks,
#       goroutines and RSS (bench/lanes -mode idle).
#   bench/lanes.sh retire [--keys 10000] [--waves 10] [--bin RELAY] [relay flags...]
#       --waves waves of --keys new api_keys with --lane-retire-after 5s
#       (unless given): after each wave, once every lane retired, the same
#       readings (bench/lanes -mode retire). The first line is the fresh
#       relay's.
# The relay runs with --sync none in front of bench/sink; --bin runs another
# relay binary (say, one built from the commit before a change).
set -euo pipefail

MODE="${1:-}"
[ -n "$MODE" ] && shift
KEYS=10000
WAVES=1
BIN=""
while [ $# -gt 0 ]; do
	case "$1" in
	--keys) KEYS="$2"; shift 2 ;;
	--waves) WAVES="$2"; shift 2 ;;
	--bin) BIN="$(realpath "$2")"; shift 2 ;;
	*) break ;;
	esac
done
case "$MODE" in idle | retire) ;; *) sed -n '2,/^set -euo/{/^set/d;p}' "$0"; exit 2 ;; esac
ARGS=("$@")
if [ "$MODE" = retire ] && [[ " ${ARGS[*]:-} " != *" --lane-retire-after "* ]]; then
	ARGS+=(--lane-retire-after 5s)
fi

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d /tmp/relay-lanes.XXXXXX)"
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	sleep 0.3
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

(cd "$ROOT" && go build -o "$TMP/sink" ./bench/sink && go build -o "$TMP/lanes" ./bench/lanes)
if [ -z "$BIN" ]; then
	(cd "$ROOT" && go build -o "$TMP/relay" ./cmd/relay)
	BIN="$TMP/relay"
fi

"$TMP/sink" -listen 127.0.0.1:0 -addr-file "$TMP/sink.addr" -lag=false >"$TMP/sink.log" 2>&1 &
PIDS+=($!)
for i in $(seq 1 100); do [ -s "$TMP/sink.addr" ] && break; sleep 0.05; done
PORT=$((20000 + RANDOM % 20000))
APORT=$((PORT + 1))
"$BIN" --sync none --ingest-url "http://$(cat "$TMP/sink.addr")" --data-dir "$TMP/data" \
	--listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$APORT" --log-level warn "${ARGS[@]}" >"$TMP/relay.log" 2>&1 &
RPID=$!
PIDS+=("$RPID")
for i in $(seq 1 400); do curl -sf -o /dev/null "http://127.0.0.1:$APORT/readyz" && break; sleep 0.05; done
sleep 2 # settled, as fresh

echo "lanes.sh $MODE: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); relay flags: ${ARGS[*]:-}"
"$TMP/lanes" -url "http://127.0.0.1:$PORT" -admin "http://127.0.0.1:$APORT" -pid "$RPID" -mode "$MODE" -keys "$KEYS" -waves "$WAVES"
