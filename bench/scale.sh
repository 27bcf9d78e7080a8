#!/usr/bin/env bash
# bench/scale.sh: the relay's scale scenarios (not part of CI; bounded, 127.0.0.1 only).
#
#   bench/scale.sh backlog [--events N] [--sync always|none] [--stop term|kill] [--cold]
#       Build an N-event backlog (default 10,000,000; 1000-event requests,
#       32 connections) while the upstream (bench/sink) answers 503, then stop
#       the relay (SIGTERM, or SIGKILL with --stop kill; --cold also drops the
#       page cache, as after a reboot: needs root), start it once more with the upstream
#       still down (RSS holding the backlog), bring the upstream up and restart the relay on the
#       backlog: time to /readyz 200 and to the first delivery, the drain rate,
#       RSS empty vs with the backlog, spool disk use vs the raw event bytes,
#       and after the drain.
#   bench/scale.sh lanes [--lanes 100] [--duration 10]
#       The same 100-event load with 1 api_key and then with --lanes api_keys
#       (one lane each), against relay --sync always in front of the sink.
#   Both: [--shape sdk|small] [--insert-ids], the bodies of bench/loadgen
#       (-profile, -insert-ids): SDK-shaped ~490 B events without insert_id
#       and time by default; the raw bytes the backlog's disk use is set
#       against are the events as sent, before the relay adds those fields.
set -euo pipefail

MODE="${1:-}"
[ -n "$MODE" ] && shift
N=10000000
SYNC=always
LANES=100
DURATION=10
DATA=""
BUILD_ONLY=0
STOP=term
COLD=0
SHAPE=sdk
IDS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--events) N="$2"; shift 2 ;;
	--sync) SYNC="$2"; shift 2 ;;
	--lanes) LANES="$2"; shift 2 ;;
	--duration) DURATION="$2"; shift 2 ;;
	--data) DATA="$2"; shift 2 ;;     # keep the spool in DIR (not removed at exit)
	--build-only) BUILD_ONLY=1; shift ;; # backlog: stop after building it (use with --data)
	--stop) STOP="$2"; shift 2 ;;
	--shape) SHAPE="$2"; shift 2 ;;
	--insert-ids) IDS=(-insert-ids); shift ;;
	--cold) COLD=1; shift ;;            # backlog: drop the page cache before the restart      # backlog: how the relay is stopped with the backlog: term or kill
	*) echo "scale.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
case "$MODE" in backlog | lanes) ;; *) sed -n '2,/^set -euo/{/^set/d;p}' "$0"; exit 2 ;; esac
case "$STOP" in term | kill) ;; *) echo "scale.sh: --stop term|kill" >&2; exit 2 ;; esac

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d /tmp/relay-scale.XXXXXX)"
[ -z "$DATA" ] && DATA="$TMP/data"
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	sleep 0.3
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { echo "[scale $(date -u +%H:%M:%S)] $*" >&2; }
now_ns() { date +%s%N; }
kv() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }

(cd "$ROOT" && go build -o "$TMP/relay" ./cmd/relay && go build -o "$TMP/loadgen" ./bench/loadgen &&
	go build -o "$TMP/sink" ./bench/sink)

"$TMP/sink" -listen 127.0.0.1:0 -addr-file "$TMP/sink.addr" -lag=false >"$TMP/sink.log" 2>&1 &
PIDS+=($!)
for i in $(seq 1 100); do [ -s "$TMP/sink.addr" ] && break; sleep 0.05; done
SINK="$(cat "$TMP/sink.addr")"
sink_stat() { curl -s "http://$SINK/stats" | sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

PORT=$((20000 + RANDOM % 20000))
APORT=$((PORT + 1))
RPID=""
start_relay() { # logname
	"$TMP/relay" --sync "$SYNC" --ingest-url "http://$SINK" --data-dir "$DATA" \
		--listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$APORT" --log-level warn >>"$TMP/$1.log" 2>&1 &
	RPID=$!
	PIDS+=("$RPID")
}
wait_ready() {
	for i in $(seq 1 2000); do
		curl -sf -o /dev/null "http://127.0.0.1:$APORT/readyz" && return 0
		sleep 0.005
	done
	echo "scale.sh: relay not ready" >&2
	return 1
}
stop_relay() { # [signal]
	kill -"${1:-TERM}" "$RPID" 2>/dev/null || true
	for i in $(seq 1 600); do kill -0 "$RPID" 2>/dev/null || break; sleep 0.05; done
	kill -9 "$RPID" 2>/dev/null || true
	wait "$RPID" 2>/dev/null || true
}
status_kb() { awk -v k="$2:" '$1==k{print $2}' "/proc/$1/status"; }
# rss PID: resident MiB, and its anonymous / file-backed (bbolt mmap) parts.
rss() { echo "$(mib "$(status_kb "$1" VmRSS)") MiB (anon $(mib "$(status_kb "$1" RssAnon)"), file $(mib "$(status_kb "$1" RssFile)"))"; }
mib() { awk -v k="$1" 'BEGIN{printf "%.0f", k/1024}'; }
du_mb() { du -sm "$DATA" | cut -f1; }

echo "scale.sh $MODE: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "$MODE" = lanes ]; then
	start_relay lanes
	wait_ready
	for k in 1 "$LANES"; do
		curl -s -o /dev/null -X POST "http://$SINK/reset"
		out=$("$TMP/loadgen" -url "http://127.0.0.1:$PORT/2/httpapi" -events 100 -c 32 -api-keys "$k" \
			-templates $((k > 64 ? 2 * k : 64)) -duration "${DURATION}s" -warmup 1s -seed "$k" \
			-profile "$SHAPE" "${IDS[@]}" | grep '^RESULT')
		want=$(kv events "$out")
		for i in $(seq 1 300); do [ "$(sink_stat counted)" -ge "$want" ] && break; sleep 0.1; done
		c=$(sink_stat counted); f=$(sink_stat first_ns); l=$(sink_stat last_ns)
		echo "api_keys=$k accepted_events_s=$(kv events_s "$out") p50_ms=$(kv p50_ms "$out") p99_ms=$(kv p99_ms "$out") errors=$(kv errors "$out") delivered_events_s=$(awk -v n="$c" -v f="$f" -v l="$l" 'BEGIN{printf "%.0f", n/((l-f)/1e9)}') rss_mib=$(mib "$(status_kb "$RPID" VmRSS)") hwm_mib=$(mib "$(status_kb "$RPID" VmHWM)")"
	done
	stop_relay
	exit 0
fi

# --- backlog ---------------------------------------------------------------------
curl -s -o /dev/null -X POST "http://$SINK/down?on=1"
start_relay build
wait_ready
sleep 3 # idle as long as the relay on the backlog below
rss_empty=$(rss "$RPID")
rss_empty_kb=$(status_kb "$RPID" VmRSS)
REQS=$(((N + 999) / 1000))
log "building a backlog of $((REQS * 1000)) events (upstream down)"
t0=$(now_ns)
out=$("$TMP/loadgen" -url "http://127.0.0.1:$PORT/2/httpapi" -events 1000 -c 32 -requests "$REQS" -duration 0 \
	-warmup 0 -timeout 60s -profile "$SHAPE" "${IDS[@]}" | grep '^RESULT')
t1=$(now_ns)
accepted=$(kv events "$out")
avg=$(kv avg_event_bytes "$out")
raw_mb=$(awk -v n="$accepted" -v a="$avg" 'BEGIN{printf "%.0f", n*a/1e6}')
echo "build: accepted=$accepted in $(awk -v d=$((t1 - t0)) 'BEGIN{printf "%.1f", d/1e9}')s ($(kv events_s "$out") events/s, p99 $(kv p99_ms "$out") ms, errors $(kv errors "$out")); raw event bytes ${raw_mb} MB (avg ${avg} B/event)"
sleep 2
rss_backlog=$(rss "$RPID")
hwm_build=$(status_kb "$RPID" VmHWM)
echo "rss: empty $rss_empty, with backlog (idle) $rss_backlog, peak while building $(mib "$hwm_build") MiB"
echo "spool: $(du_mb) MB on disk with the backlog (raw event bytes ${raw_mb} MB: $(awk -v d="$(du_mb)" -v r="$raw_mb" 'BEGIN{printf "%.2f", d/r}')x); sink refused $(sink_stat refused) requests"
ts=$(now_ns)
stop_relay "$([ "$STOP" = kill ] && echo KILL || echo TERM)"
echo "stop ($STOP) with backlog: $(awk -v d=$(($(now_ns) - ts)) 'BEGIN{printf "%.2f", d/1e9}')s"
[ "$BUILD_ONLY" = 1 ] && exit 0

if [ "$COLD" = 1 ]; then
	sync
	if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
		echo "page cache dropped (cold restart and drain)"
	else
		echo "scale.sh: --cold needs root (/proc/sys/vm/drop_caches); the page cache stays warm" >&2
	fi
fi
# The first start after the stop (it replays the write-ahead log after a
# kill) with the upstream still down: what the backlog on disk costs in
# memory, a fresh relay on it (delivery retrying, idle) against the fresh
# relay on the empty spool above.
ts=$(now_ns)
start_relay held
wait_ready
echo "first start on the backlog (upstream down): ready after $(awk -v d=$(($(now_ns) - ts)) 'BEGIN{printf "%.3f", d/1e9}')s"
sleep 3
held_kb=$(status_kb "$RPID" VmRSS)
echo "rss: fresh on the empty spool $rss_empty, fresh on the backlog (upstream down, idle 3 s) $(rss "$RPID"); $(awk -v a="$held_kb" -v b="$rss_empty_kb" 'BEGIN{printf "%.2fx (%d vs %d KiB)", a/b, a, b}')"
stop_relay "$([ "$STOP" = kill ] && echo KILL || echo TERM)"
curl -s -o /dev/null -X POST "http://$SINK/reset"
curl -s -o /dev/null -X POST "http://$SINK/down?on=0"
log "restarting on the backlog, upstream up"
ts=$(now_ns)
start_relay restart
wait_ready
tr=$(now_ns)
rss_ready=$(rss "$RPID")
for i in $(seq 1 2000); do [ "$(sink_stat first_ns)" != 0 ] && break; sleep 0.005; done
first=$(sink_stat first_ns)
echo "restart: ready after $(awk -v d=$((tr - ts)) 'BEGIN{printf "%.3f", d/1e9}')s, first delivery after $(awk -v d=$((first - ts)) 'BEGIN{printf "%.3f", d/1e9}')s; rss when ready $rss_ready"
limit=$((N / 50000 + 120))
t_end=$(($(date +%s) + limit))
du_peak=0
while [ "$(sink_stat counted)" -lt "$accepted" ] && [ "$(date +%s)" -lt "$t_end" ]; do
	d=$(du_mb)
	[ "$d" -gt "$du_peak" ] && du_peak=$d
	sleep 1
done
c=$(sink_stat counted); f=$(sink_stat first_ns); l=$(sink_stat last_ns)
echo "drain: $c of $accepted delivered in $(awk -v d=$((l - f)) 'BEGIN{printf "%.1f", d/1e9}')s: $(awk -v n="$c" -v d=$((l - f)) 'BEGIN{printf "%.0f", n/(d/1e9)}') events/s; peak RSS while draining $(mib "$(status_kb "$RPID" VmHWM)") MiB, now $(rss "$RPID"); $(curl -s "http://127.0.0.1:$APORT/metrics" | grep -E '^relay_delivery_events_delivered_total' || true)"
for i in 0 5 10 15 20 25 30; do
	[ "$i" -gt 0 ] && sleep 5
	echo "spool after drain (+${i}s): $(du_mb) MB; rss $(rss "$RPID")"
	[ "$(du_mb)" -lt 50 ] && break
done
stop_relay
