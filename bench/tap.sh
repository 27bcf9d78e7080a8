#!/usr/bin/env bash
# bench/tap.sh: ingest throughput of one relay with and without a live tap
# attached (`relay tap --device D`, D the loadgen's device of rank --rank:
# 50 by default, a device sending ~0.1% of the events (the load has 64
# distinct bodies, so a rarer rank may not be in them at all); rank 0,
# the zipf distribution's hottest, sends ~10% of all events), interleaved over --runs
# pairs (off/on, then on/off), against the counting sink (bench/sink), on 127.0.0.1. Prints each
# run and the medians. The same relay process serves every run: only the
# tap differs.
#
# usage: bench/tap.sh [--runs 5] [--duration 10] [--events 100] [--conns 32] [--sync none|always] [--rank 50]
set -euo pipefail
RUNS=5
DURATION=10
EVENTS=100
CONNS=32
SYNC=none
RANK=50
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--duration) DURATION=$2; shift 2 ;;
	--events) EVENTS=$2; shift 2 ;;
	--conns) CONNS=$2; shift 2 ;;
	--sync) SYNC=$2; shift 2 ;;
	--rank) RANK=$2; shift 2 ;;
	*) echo "unknown flag $1" >&2; exit 2 ;;
	esac
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
(cd "$ROOT" && go build -o "$TMP/relay" ./cmd/relay && go build -o "$TMP/loadgen" ./bench/loadgen &&
	go build -o "$TMP/sink" ./bench/sink)
"$TMP/sink" -listen 127.0.0.1:0 -addr-file "$TMP/sink.addr" >"$TMP/sink.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do [ -s "$TMP/sink.addr" ] && break; sleep 0.05; done
SINK="$(cat "$TMP/sink.addr")"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P=$(port); A=$(port)
"$TMP/relay" --sync "$SYNC" --ingest-url "http://$SINK" --data-dir "$TMP/data" --listen "127.0.0.1:$P" \
	--admin-listen "127.0.0.1:$A" --log-level warn --spool-min-free-bytes 0 >"$TMP/relay.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$P/healthz" >/dev/null && break; sleep 0.05; done
# loadgen's deviceUUID(RANK)
DEVICE=$(python3 -c '
import sys
d=int(sys.argv[1]); M=(1<<64)-1
h=((d+1)*0x9e3779b97f4a7c15)&M
g=h^(h>>29)^0xbf58476d1ce4e5b9
print("%08x-%04x-4%03x-%x%03x-%012x"%((h>>32)&0xffffffff,(h>>16)&0xffff,h&0xfff,8+g%4,(g>>8)&0xfff,(g>>16)&0xffffffffffff))' "$RANK")
run() {
	"$TMP/loadgen" -url "http://127.0.0.1:$P/2/httpapi" -c "$CONNS" -events "$EVENTS" -duration "${DURATION}s" \
		-warmup 1s | grep '^RESULT' | tr ' ' '\n' | sed -n 's/^events_s=//p'
}
tapped() {
	"$TMP/relay" tap --admin "http://127.0.0.1:$A" --device "$DEVICE" --duration 10m >"$TMP/tap.out" 2>"$TMP/tap.err" &
	TAP=$!
	sleep 0.5
	on=$(run); ON+=("$on")
	lines=$(wc -l <"$TMP/tap.out")
	kill "$TAP"; wait "$TAP" 2>/dev/null || true
	log "run $i on:  $on events/s (tap printed $lines events of device $DEVICE)"
}
untapped() { off=$(run); OFF+=("$off"); log "run $i off: $off events/s"; }
# Off/on, then on/off: a drift of the machine's load over the runs does not
# favour either side.
OFF=(); ON=(); RATIOS=()
for i in $(seq 1 "$RUNS"); do
	if [ $((i % 2)) = 1 ]; then untapped; tapped; else tapped; untapped; fi
	RATIOS+=("$(awk -v a="$off" -v b="$on" 'BEGIN{printf "%.3f", b/a}')")
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
m0=$(med "${OFF[@]}"); m1=$(med "${ON[@]}")
echo "off (no tap): ${OFF[*]} -> median $m0 events/s"
echo "on (tap --device): ${ON[*]} -> median $m1 events/s"
awk -v a="$m0" -v b="$m1" 'BEGIN{printf "on/off of the medians: %.3f\n", b/a}'
echo "on/off per pair: ${RATIOS[*]} -> median $(med "${RATIOS[@]}")"
