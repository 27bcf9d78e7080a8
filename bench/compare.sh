#!/usr/bin/env bash
# bench/compare.sh: the same load, in one run, against
#   (a) the relay with --sync always, (b) the relay with --sync none,
#   (c) nginx from Debian's package as a reverse proxy, two ways:
#       nginx: tuned (bodies in memory, kept-alive upstream connections, no
#       access log), the baseline of issue 25's targets; nginx-debian: the
#       package's own nginx.conf settings and a proxy site with kept-alive
#       upstream connections (the earlier performance issue's reference);
#       the opt-in target nginx-plain has nginx's built-in defaults,
# all in front of the same counting sink (bench/sink), on 127.0.0.1 only.
#
# Per target and run: a closed-loop peak run (wrk or bench/loadgen, --tool),
# then an open-loop bench/loadgen run at half of that peak (accept latency and
# end-to-end lag: send time stamped in each event, subtracted at the sink).
# Prints one table (medians over --runs) and the ratios relay/nginx, against
# the tuned nginx first (the baseline issue 25's targets name).
#
# Bodies (--shape): sdk (default), events as the official SDKs send them,
# ~490 B, no insert_id or time (bench/loadgen -profile sdk); small, ~100 B
# events. wrk cycles through several different bodies. --insert-ids gives
# every event an insert_id and a time, as a server-side sender would.
# Per event and target, besides CPU: request body MB/s (10^6 bytes); for the
# relay, over the peak run and its delivery, the bytes it allocated
# (go_memstats_alloc_bytes_total from its /metrics, before and after) and the
# bytes it moved through read/write system calls (rchar+wchar of
# /proc/PID/io: request in, spool files written, upstream body out, answers;
# Go does socket I/O with read and write). Not for nginx: it receives and
# sends on sockets with recv/send, which rchar/wchar do not count.
#
# usage: bench/compare.sh [--smoke] [--duration 10] [--events 100] [--conns 32]
#                         [--runs 3] [--tool wrk|loadgen] [--shape sdk|small]
#                         [--insert-ids] [--relay-args "--flag value ..."]
#                         [--targets "always none nginx nginx-debian"]
#                         (targets: always none nginx nginx-debian nginx-plain
#                          base-always base-none always-tls none-tls
#                          always-gzip none-gzip)
#                         [--profile DIR] [--out FILE] [--base-bin RELAY]
# --base-bin adds the targets base-always and base-none: the same load against
# another relay binary (say, one built from the commit before a change), in the
# same run, so that a change is measured against its baseline on this noisy box.
# always-tls and none-tls: the relay serving HTTPS (--tls-cert/--tls-key, a
# self-signed P-256 certificate made with openssl; clients do not verify it),
# to set against always and none in the same run for the cost of TLS.
# always-gzip and none-gzip: the relay with --upstream-gzip (the sink decodes
# the bodies, as the upstream would, on the same cores) for the cost of gzip.
# --relay-args: extra flags for every relay target (base ones included).
# Installs wrk and nginx with apt-get when missing. Cleans up on exit.
set -euo pipefail

DURATION=10
EVENTS=100
CONNS=32
RUNS=3
TOOL=wrk
TARGETS="always none nginx nginx-debian"
SHAPE=sdk
IDS=()
RELAY_ARGS=()
PROFILE_DIR=""
OUT=""
HALF=1
while [ $# -gt 0 ]; do
	case "$1" in
	--smoke) DURATION=3; RUNS=1; shift ;;
	--duration) DURATION="$2"; shift 2 ;;
	--events) EVENTS="$2"; shift 2 ;;
	--conns) CONNS="$2"; shift 2 ;;
	--runs) RUNS="$2"; shift 2 ;;
	--tool) TOOL="$2"; shift 2 ;;
	--targets) TARGETS="$2"; shift 2 ;;
	--profile) PROFILE_DIR="$2"; shift 2 ;;
	--no-half) HALF=0; shift ;;
	--out) OUT="$2"; shift 2 ;;
	--base-bin) BASE_BIN="$(realpath "$2")"; shift 2 ;;
	--shape) SHAPE="$2"; shift 2 ;;
	--insert-ids) IDS=(-insert-ids); shift ;;
	--relay-args) read -r -a RELAY_ARGS <<<"$2"; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
	*) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
case "$TOOL" in wrk | loadgen) ;; *) echo "compare.sh: --tool wrk|loadgen" >&2; exit 2 ;; esac
case "$SHAPE" in sdk | small) ;; *) echo "compare.sh: --shape sdk|small" >&2; exit 2 ;; esac

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d /tmp/relay-compare.XXXXXX)"
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do
		[ -n "$p" ] && kill "$p" 2>/dev/null || true
	done
	sleep 0.3
	for p in "${PIDS[@]:-}"; do
		[ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
	done
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[compare $(date -u +%H:%M:%S)] $*" >&2; }

# --- tools -------------------------------------------------------------------
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]} with apt-get"
	SUDO=""
	[ "$(id -u)" -ne 0 ] && SUDO=sudo
	$SUDO apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2
	# Debian starts the packaged nginx service; this script runs its own.
	$SUDO systemctl stop nginx >/dev/null 2>&1 || $SUDO service nginx stop >/dev/null 2>&1 || true
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
for t in curl go; do
	command -v "$t" >/dev/null || { echo "compare.sh: $t is required" >&2; exit 2; }
done

log "building relay, loadgen, sink"
(cd "$ROOT" && go build -o "$TMP/relay" ./cmd/relay && go build -o "$TMP/loadgen" ./bench/loadgen &&
	go build -o "$TMP/sink" ./bench/sink)

free_port() {
	local p i
	for i in $(seq 1 100); do
		p=$((20000 + RANDOM % 30000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

wait_http() { # url seconds [pid]: also gives up when pid has exited
	local i
	for i in $(seq 1 $(($2 * 20))); do
		curl -sf -o /dev/null "$1" && return 0
		if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
			echo "compare.sh: $1: the process exited" >&2
			return 1
		fi
		sleep 0.05
	done
	echo "compare.sh: $1 did not answer" >&2
	return 1
}

CLK_TCK=$(getconf CLK_TCK)
# cpu_ticks PID...: utime+stime of the processes and their children.
cpu_ticks() {
	local total=0 p kids
	for p in "$@"; do
		[ -r "/proc/$p/stat" ] || continue
		# fields after the ")" of comm: state is 1, utime 12, stime 13
		total=$((total + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
		kids=$(ps -o pid= --ppid "$p" 2>/dev/null || true)
		for k in $kids; do
			[ -r "/proc/$k/stat" ] && total=$((total + $(sed 's/^.*) //' "/proc/$k/stat" | awk '{print $12 + $13}')))
		done
	done
	echo "$total"
}
# hwm_kb PID: peak RSS of the process plus its children (nginx workers).
hwm_kb() {
	local total=0 p
	for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
		[ -r "/proc/$p/status" ] && total=$((total + $(awk '/^VmHWM/{print $2}' "/proc/$p/status")))
	done
	echo "$total"
}

# --- sink ----------------------------------------------------------------------
"$TMP/sink" -listen 127.0.0.1:0 -addr-file "$TMP/sink.addr" >"$TMP/sink.log" 2>&1 &
PIDS+=($!)
for i in $(seq 1 100); do [ -s "$TMP/sink.addr" ] && break; sleep 0.05; done
SINK="$(cat "$TMP/sink.addr")"
log "sink on $SINK"

# wrk's bodies: several different ones (events vary between requests as they
# do in loadgen), sent in turn; fewer of the large ones (memory in wrk).
NBODIES=$((20000 / EVENTS))
[ "$NBODIES" -gt 64 ] && NBODIES=64
[ "$NBODIES" -lt 8 ] && NBODIES=8
mkdir -p "$TMP/bodies"
"$TMP/loadgen" -dump-dir "$TMP/bodies" -templates "$NBODIES" -events "$EVENTS" -profile "$SHAPE" "${IDS[@]}"
BODY_BYTES=$(cat "$TMP"/bodies/body-*.json | wc -c)
AVG_BODY=$((BODY_BYTES / NBODIES))
cat >"$TMP/post.lua" <<EOF
local bodies = {}
for i = 0, $NBODIES - 1 do
  local f = assert(io.open(string.format("$TMP/bodies/body-%d.json", i), "rb"))
  bodies[#bodies + 1] = f:read("*a")
  f:close()
end
local threads = 0
setup = function(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
init = function(args)
  reqs = {}
  for i, b in ipairs(bodies) do
    reqs[i] = wrk.format("POST", nil, {["Host"] = "127.0.0.1", ["Content-Type"] = "application/json"}, b)
  end
  k = ((tid or 0) * 7) % #reqs
end
request = function()
  k = k % #reqs + 1
  return reqs[k]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK requests=%d duration_us=%d status_err=%d sock_err=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
EOF

# --- targets -------------------------------------------------------------------
TPID=""
TURL=""
ADMIN=""
start_target() { # name run
	local port
	port=$(free_port)
	TURL="http://127.0.0.1:$port/2/httpapi"
	case "$1" in
	always | none | base-always | base-none | always-tls | none-tls | always-gzip | none-gzip)
		local aport attempt bin="$TMP/relay" mode="$1" scheme=http extra=()
		case "$1" in *-gzip) mode="${1%-gzip}" extra=(--upstream-gzip) ;; esac
		case "$1" in base-*)
			[ -x "${BASE_BIN:-}" ] || { echo "compare.sh: target $1 needs --base-bin" >&2; exit 2; }
			bin="$BASE_BIN" mode="${1#base-}" ;;
		esac
		case "$1" in *-tls)
			mode="${1%-tls}" scheme=https
			if [ ! -f "$TMP/tls.key" ]; then
				openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
					-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
					-keyout "$TMP/tls.key" -out "$TMP/tls.pem" 2>/dev/null
			fi
			extra=(--tls-cert "$TMP/tls.pem" --tls-key "$TMP/tls.key")
			TURL="https://127.0.0.1:$port/2/httpapi" ;;
		esac
		for attempt in 1 2 3; do
			aport=$(free_port)
			while [ "$aport" = "$port" ]; do aport=$(free_port); done
			ADMIN="http://127.0.0.1:$aport"
			rm -rf "$TMP/data"
			"$bin" --sync "$mode" --ingest-url "http://$SINK" --data-dir "$TMP/data" \
				--listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$aport" --log-level warn "${extra[@]}" "${RELAY_ARGS[@]}" \
				>"$TMP/relay-$1-$2.log" 2>&1 &
			TPID=$!
			PIDS+=("$TPID")
			# A port free_port chose may be taken meanwhile (the relay
			# then exits at once: try other ports).
			wait_http "$ADMIN/readyz" 20 "$TPID" && break
			log "relay did not start (attempt $attempt); its log:"
			tail -5 "$TMP/relay-$1-$2.log" >&2
			stop_target
			[ "$attempt" = 3 ] && exit 1
			port=$(free_port)
			TURL="$scheme://127.0.0.1:$port/2/httpapi"
		done
		# A relay enforcing a tracking plan (bench/plan.sh): the load
		# starts once every plan is read (/readyz names those not yet).
		for attempt in $(seq 1 600); do
			curl -sf "$ADMIN/readyz" | grep -q "tracking plan: not read yet" || break
			sleep 0.05
		done
		;;
	nginx | nginx-debian | nginx-plain)
		ADMIN=""
		mkdir -p "$TMP/nginx"
		local user="" http conns=4096
		# As root, nginx would run its workers as nobody, who cannot enter $TMP.
		[ "$(id -u)" -eq 0 ] && user="user root;"
		# The site of nginx-debian and nginx: kept-alive upstream connections.
		local keptalive="upstream sink { server $SINK; keepalive 64; }
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://sink;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
  }"
		case "$1" in
		nginx-debian)
			# The http settings of the /etc/nginx/nginx.conf Debian's
			# package installs (sendfile and tcp_nopush: a body larger
			# than the 16 KiB default buffer goes through a temp file,
			# and without them such bodies pass ten times slower; an
			# access log; gzip for text/html answers), its 768
			# connections per worker, and the kept-alive site. On this
			# box it passes what the issue measured for "a plain reverse proxy"
			# (bench/RESULTS.md, tenth session): the ratio targets of the earlier performance issue use it.
			conns=768
			local mime=""
			[ -f /etc/nginx/mime.types ] && mime="include /etc/nginx/mime.types;"
			http="sendfile on;
  tcp_nopush on;
  types_hash_max_size 2048;
  $mime
  default_type application/octet-stream;
  access_log $TMP/nginx/access.log;
  gzip on;
  client_max_body_size 20m;
  $keptalive"
			;;
		nginx)
			# Tuned: the body kept in memory, kept-alive upstream
			# connections, no access log. The baseline issue 25's
			# targets name (ratios against it print first).
			http="access_log off;
  client_max_body_size 20m;
  client_body_buffer_size 1m;
  $keptalive"
			;;
		*)
			# Plain: proxy_pass and nginx's built-in defaults (an
			# access log, a 16 KiB body buffer so that larger bodies go
			# through a temp file, a new upstream connection per
			# request); only the body size limit is raised, as for the
			# tuned one. A reference for the issue's figures, not a target.
			http="access_log $TMP/nginx/access.log;
  client_max_body_size 20m;
  server {
    listen 127.0.0.1:$port;
    location / { proxy_pass http://$SINK; }
  }"
			;;
		esac
		cat >"$TMP/nginx/nginx.conf" <<EOF
$user
worker_processes auto;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections $conns; }
http {
  client_body_temp_path $TMP/nginx/body;
  proxy_temp_path $TMP/nginx/proxy;
  fastcgi_temp_path $TMP/nginx/fastcgi;
  uwsgi_temp_path $TMP/nginx/uwsgi;
  scgi_temp_path $TMP/nginx/scgi;
  $http
}
EOF
		"$NGINX" -e "$TMP/nginx/error.log" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" >"$TMP/nginx/stdout.log" 2>&1 &
		TPID=$!
		PIDS+=("$TPID")
		# nginx answers 404 from the sink for an unknown path: wait for any answer.
		for i in $(seq 1 100); do
			curl -s -o /dev/null "http://127.0.0.1:$port/" && break
			sleep 0.05
		done
		;;
	esac
}
stop_target() {
	kill "$TPID" 2>/dev/null || true
	for i in $(seq 1 100); do kill -0 "$TPID" 2>/dev/null || break; sleep 0.05; done
	kill -9 "$TPID" 2>/dev/null || true
	wait "$TPID" 2>/dev/null || true
}
# alloc_bytes: the relay's go_memstats_alloc_bytes_total ("" for nginx).
alloc_bytes() {
	[ -n "$ADMIN" ] || return 0
	curl -s "$ADMIN/metrics" | awk '$1 == "go_memstats_alloc_bytes_total" {printf "%.0f", $2}'
}
# io_bytes PID: the relay's rchar+wchar (bytes through read/write system
# calls, sockets and files alike) and its children's; "" when unreadable,
# and for nginx, whose recv/send on sockets rchar/wchar do not count (its
# figure would hold only the upstream writev and the temp files).
io_bytes() {
	local total=0 p n
	[ -n "$ADMIN" ] || return 0
	for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
		n=$(awk '/^(rchar|wchar):/ {s += $2} END {printf "%.0f", s}' "/proc/$p/io" 2>/dev/null) || return 0
		total=$((total + n))
	done
	echo "$total"
}
per_event() { # before after events: (after-before)/events, or "-"
	awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN{if (a == "" || b == "" || n == 0) print "-"; else printf "%.0f", (b - a) / n}'
}
sink_stat() { curl -s "http://$SINK/stats" | sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
sink_reset() { curl -s -o /dev/null -X POST "http://$SINK/reset"; }
# sink_lag 0|1: the peak runs want a sink that only counts (searching bodies
# for the loadgen's send stamps costs it about 40% more CPU, taken from
# the target on these two cores); the half-peak runs measure the lag.
sink_lag() { curl -s -o /dev/null -X POST "http://$SINK/lag?on=$1"; }
# wait_delivered N: until the sink counted N events or stopped progressing 3 s.
wait_delivered() {
	local last=-1 same=0 c
	while :; do
		c=$(sink_stat counted)
		[ "$c" -ge "$1" ] && return 0
		if [ "$c" = "$last" ]; then
			same=$((same + 1))
			[ $same -ge 30 ] && { log "delivery stalled at $c of $1"; return 0; }
		else
			same=0
		fi
		last=$c
		sleep 0.1
	done
}
kv() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }

RESULTS="$TMP/results.tsv"
: >"$RESULTS"
for run in $(seq 1 "$RUNS"); do
	for target in $TARGETS; do
		log "run $run/$RUNS: $target, $EVENTS events/request, $CONNS conns, ${DURATION}s, $TOOL"
		start_target "$target" "$run"
		sink_reset
		sink_lag 0
		c0=$(cpu_ticks "$TPID")
		a0=$(alloc_bytes)
		io0=$(io_bytes "$TPID")
		if [ -n "$PROFILE_DIR" ] && [ -n "$ADMIN" ] && [ "$run" = 1 ]; then
			mkdir -p "$PROFILE_DIR"
			psecs=$((DURATION > 2 ? DURATION - 1 : 1))
			curl -s -o "$PROFILE_DIR/cpu-$target-e$EVENTS.pprof" "$ADMIN/debug/pprof/profile?seconds=$psecs" &
			PROF=$!
		fi
		if [ "$TOOL" = wrk ]; then
			out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$TMP/post.lua" "$TURL" | grep '^WRK')
			# the bodies are sent in turn: ok requests carried ~AVG_BODY each.
			reqs=$(kv requests "$out")
			bad=$(($(kv status_err "$out") + $(kv sock_err "$out")))
			secs=$(awk -v us="$(kv duration_us "$out")" 'BEGIN{print us/1e6}')
			ok=$((reqs - bad))
			eps=$(awk -v n="$ok" -v e="$EVENTS" -v s="$secs" 'BEGIN{printf "%.0f", n*e/s}')
			rps=$(awk -v n="$ok" -v s="$secs" 'BEGIN{printf "%.0f", n/s}')
			p50=$(awk -v us="$(kv p50_us "$out")" 'BEGIN{printf "%.2f", us/1000}')
			p99=$(awk -v us="$(kv p99_us "$out")" 'BEGIN{printf "%.2f", us/1000}')
			mbs=$(awk -v n="$ok" -v b="$AVG_BODY" -v s="$secs" 'BEGIN{printf "%.1f", n*b/s/1e6}')
		else
			out=$("$TMP/loadgen" -url "$TURL" -c "$CONNS" -events "$EVENTS" -duration "${DURATION}s" -warmup 0 \
				-profile "$SHAPE" "${IDS[@]}" | grep '^RESULT')
			ok=$(kv status_200 "$out")
			ok=${ok:-0}
			bad=$(kv errors "$out")
			eps=$(kv events_s "$out")
			rps=$(kv req_s "$out")
			p50=$(kv p50_ms "$out")
			p99=$(kv p99_ms "$out")
			mbs=$(kv mb_s "$out")
		fi
		accepted=$((ok * EVENTS))
		wait_delivered "$accepted"
		c1=$(cpu_ticks "$TPID")
		a1=$(alloc_bytes)
		io1=$(io_bytes "$TPID")
		allocev=$(per_event "$a0" "$a1" "$accepted")
		ioev=$(per_event "$io0" "$io1" "$accepted")
		[ -n "${PROF:-}" ] && { wait "$PROF" || true; PROF=""; }
		counted=$(sink_stat counted)
		first=$(sink_stat first_ns)
		last=$(sink_stat last_ns)
		deps=$(awk -v n="$counted" -v f="$first" -v l="$last" 'BEGIN{d=(l-f)/1e9; if (d<=0) d=1; printf "%.0f", n/d}')
		cpum=$(awk -v t=$((c1 - c0)) -v hz="$CLK_TCK" -v n="$accepted" 'BEGIN{if(n==0){print "nan"}else{printf "%.2f", t/hz/n*1e6}}')
		# Half of the peak, open loop: accept latency and end-to-end lag.
		h50="-" h99="-" lag99="-"
		if [ "$HALF" = 1 ] && [ "$rps" -gt 0 ]; then
			sink_reset
			sink_lag 1
			hrate=$((rps / 2))
			[ "$hrate" -lt 1 ] && hrate=1
			hout=$("$TMP/loadgen" -url "$TURL" -c "$CONNS" -events "$EVENTS" -duration "${DURATION}s" -warmup 1s \
				-rate "$hrate" -seed 2 -profile "$SHAPE" "${IDS[@]}" | grep '^RESULT')
			h50=$(kv p50_ms "$hout")
			h99=$(kv p99_ms "$hout")
			hok=$(kv status_200 "$hout")
			# the warm-up's events arrive too; wait for all, then read the lag.
			wait_delivered $(((${hok:-0}) * EVENTS))
			lag99=$(sink_stat lag_p99_ms)
		fi
		rss=$(($(hwm_kb "$TPID") / 1024))
		stop_target
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$target" "$run" "$eps" "$rps" "$p50" "$p99" \
			"$h50" "$h99" "$deps" "$lag99" "$cpum" "$rss" "$bad" "$mbs" "$allocev" "$ioev" >>"$RESULTS"
		log "$target: $eps events/s ($rps req/s, $mbs MB/s), p50 $p50 ms, p99 $p99 ms; half: p99 $h99 ms, lag p99 $lag99 ms; delivered $deps events/s; ${cpum} CPU s/M events; allocated $allocev B/event; read+write $ioev B/event; peak RSS ${rss} MiB; errors $bad"
	done
done

# --- table ---------------------------------------------------------------------
label() { # target: its name in the table
	case $1 in
	always | none) echo "relay --sync $1" ;;
	always-tls | none-tls) echo "relay --sync ${1%-tls}, TLS" ;;
	always-gzip | none-gzip) echo "relay --sync ${1%-gzip}, upstream gzip" ;;
	base-always | base-none) echo "base relay --sync ${1#base-}" ;;
	*) echo "$1" ;;
	esac
}
median() { # target column
	awk -F'\t' -v t="$1" -v c="$2" '$1==t && $c!="-" && $c!="nan" {print $c}' "$RESULTS" | sort -g |
		awk '{a[NR]=$1} END{if(NR==0){print "-"} else if(NR%2){print a[(NR+1)/2]} else {printf "%.10g\n", (a[NR/2]+a[NR/2+1])/2}}'
}
{
	echo
	echo "compare.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "load: $TOOL, $CONNS connections, $EVENTS $SHAPE events/request${IDS:+ with insert_ids} (~$((AVG_BODY / EVENTS)) B/event, $NBODIES different bodies), ${DURATION}s per run, median of $RUNS run(s)"
	echo
	echo "| target | accepted events/s | body MB/s | requests/s | p50 ms | p99 ms | p99 ms at half peak | delivered events/s | e2e lag p99 ms (half peak) | CPU s / M events | allocated B/event | read+write B/event | peak RSS MiB | errors |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	for t in $TARGETS; do
		name=$(label "$t")
		echo "| $name | $(median "$t" 3) | $(median "$t" 14) | $(median "$t" 4) | $(median "$t" 5) | $(median "$t" 6) | $(median "$t" 8) | $(median "$t" 9) | $(median "$t" 10) | $(median "$t" 11) | $(median "$t" 15) | $(median "$t" 16) | $(median "$t" 12) | $(median "$t" 13) |"
	done
	echo
	echo "allocated: the relay's go_memstats_alloc_bytes_total over the peak run and its delivery, per accepted event."
	echo "read+write: the relay's rchar+wchar of /proc/PID/io over the same span, per accepted event: bytes copied between it and"
	echo "the kernel (request in, spool files, upstream body out, answers); copies inside the process are not counted. nginx: -"
	echo "(its socket recv/send are not counted in rchar/wchar)."
	# The tuned nginx first: the baseline issue 25's targets name.
	for ref in nginx nginx-debian nginx-plain; do
		echo " $TARGETS " | grep -q " $ref " || continue
		n_eps=$(median "$ref" 3)
		n_rps=$(median "$ref" 4)
		n_cpu=$(median "$ref" 11)
		n_rss=$(median "$ref" 12)
		echo
		for t in always none base-always base-none always-gzip none-gzip; do
			echo " $TARGETS " | grep -q " $t " || continue
			awk -v t="$(label "$t")" -v r="$ref" -v a="$(median "$t" 3)" -v b="$n_eps" -v c="$(median "$t" 11)" -v d="$n_cpu" \
				-v e="$(median "$t" 12)" -v f="$n_rss" -v g="$(median "$t" 4)" -v h="$n_rps" \
				'function x(p, q) { return (q + 0 > 0 && p != "-") ? sprintf("%.2fx", p / q) : "-" }
				BEGIN{printf "%s / %s: events/s %s, requests/s %s, CPU per event %s, peak RSS %s\n", t, r, x(a, b), x(g, h), x(c, d), x(e, f)}'
		done
	done
	# A change against its baseline (--base-bin): the per-event costs too.
	for m in always none; do
		echo " $TARGETS " | grep -q " $m " && echo " $TARGETS " | grep -q " base-$m " || continue
		[ "$m" = always ] && echo
		awk -v t="$(label "$m")" -v r="$(label "base-$m")" -v a="$(median "$m" 3)" -v b="$(median "base-$m" 3)" \
			-v c="$(median "$m" 11)" -v d="$(median "base-$m" 11)" -v e="$(median "$m" 15)" -v f="$(median "base-$m" 15)" \
			-v g="$(median "$m" 16)" -v h="$(median "base-$m" 16)" -v i="$(median "$m" 12)" -v j="$(median "base-$m" 12)" \
			'function x(p, q) { return (q + 0 > 0 && p != "-") ? sprintf("%.2fx", p / q) : "-" }
			BEGIN{printf "%s / %s: events/s %s, CPU per event %s, allocated per event %s, read+write per event %s, peak RSS %s\n", t, r, x(a, b), x(c, d), x(e, f), x(g, h), x(i, j)}'
	done
	echo
	echo "raw runs (target run events/s req/s p50 p99 half_p50 half_p99 delivered/s lag_p99 cpu_s_per_M rss_MiB errors MB/s alloc_B/event rw_B/event):"
	cat "$RESULTS"
} | tee ${OUT:+"$OUT"}
