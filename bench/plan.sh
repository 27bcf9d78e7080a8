#!/usr/bin/env bash
# bench/plan.sh: what enforcing a tracking plan costs, side by side on this
# box: bench/compare.sh's relay (--sync always, 100 SDK-shaped events per
# request by default) in block mode against a 200-event-type plan that the
# load follows (every event is checked in full and delivered), interleaved
# run by run with the same binary with --tracking-plan off (base-always).
# The plan is read at each start from `relay sim`'s taxonomy API, seeded
# here: the load's 10 event types with their properties (regexes, enums,
# required, an array), 190 others with 3 properties each, and the load's
# user properties.
#
# PLAN_MODE=filter measures filter mode instead of block (the same full
# check: the load has no unplanned property to remove).
#
# PLAN_BASE_BIN=RELAY measures a change to enforcement instead: that relay
# binary (say, one built from the commit before it) in the same mode as the
# base, interleaved with this tree's.
#
# usage: bench/plan.sh [compare.sh flags, e.g. --runs 5 --duration 10]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d /tmp/relay-plan.XXXXXX)"
SIMPID=""
cleanup() {
	[ -n "$SIMPID" ] && kill "$SIMPID" 2>/dev/null || true
	rm -rf "$TMP"
}
trap cleanup EXIT
(cd "$ROOT" && go build -o "$TMP/relay" ./cmd/relay)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SIM="http://127.0.0.1:$port"
"$TMP/relay" sim --listen "127.0.0.1:$port" --log-level warn >"$TMP/sim.log" 2>&1 &
SIMPID=$!
for _ in $(seq 1 200); do curl -sf -o /dev/null "$SIM/sim/healthz" && break; sleep 0.05; done

KEY=b3nch000000000000000000000000000 # bench/loadgen's api_key (-api-keys 1)
tax() { # method path form-fields...
	local m="$1" p="$2" args=()
	shift 2
	for f in "$@"; do args+=(--data-urlencode "$f"); done
	curl -sf -o /dev/null -u "$KEY:bench-secret" -X "$m" "${args[@]}" "$SIM/api/2/taxonomy/$p" ||
		{ echo "plan.sh: $m $p $* failed" >&2; exit 1; }
}
# Shared properties (an event type's own rules override them).
for p in product_id page_path page_title referrer query screen element_id note prop_0 prop_1 prop_2; do
	tax POST event-property event_property=$p type=string
done
for p in price quantity results position sent_us; do tax POST event-property event_property=$p type=number; done
tax POST event-property event_property=category type=enum enum_values=shoes,electronics,books,garden,toys,grocery
tax POST event-property event_property=tags type=string is_array_type=true
tax POST event-property event_property=filters type=any
tax POST user-property user_property=plan type=enum enum_values=free,growth,enterprise
tax POST user-property user_property=signup_cohort type=string 'regex=2026-W[0-9]{2}'
tax POST user-property user_property=beta type=boolean
for et in "Product Viewed" "Add To Cart" "Checkout Started" "Order Completed"; do
	tax POST event "event_type=$et"
	tax POST event-property "event_type=$et" event_property=product_id type=string 'regex=SKU-[0-9]{6}' is_required=true
done
for et in "Page Viewed" "session_start"; do
	tax POST event "event_type=$et"
	tax POST event-property "event_type=$et" event_property=page_path type=string 'regex=/.*'
done
tax POST event "event_type=Search"
for et in "Signed In" "Button Clicked" "Video Played"; do
	tax POST event "event_type=$et"
	tax POST event-property "event_type=$et" event_property=element_id type=string 'regex=btn-.*'
done
for i in $(seq 11 200); do
	tax POST event "event_type=Filler Event $i"
	tax POST event-property "event_type=Filler Event $i" event_property=prop_0 type=string is_required=true
	tax POST event-property "event_type=Filler Event $i" event_property=prop_1 type=string 'regex=[a-z]+'
done

printf 'projects:\n  - name: bench\n    api_key: %s\n    secret_key: bench-secret\n' "$KEY" >"$TMP/creds.yaml"
echo bench-token >"$TMP/token"
chmod 600 "$TMP/creds.yaml" "$TMP/token"
# The premise: the load follows the plan (block mode checks every event in
# full and delivers it). A relay delivering to the sim takes a sample of
# the load's bodies; no violation may be counted.
(cd "$ROOT" && go build -o "$TMP/loadgen" ./bench/loadgen)
mkdir -p "$TMP/bodies"
"$TMP/loadgen" -dump-dir "$TMP/bodies" -templates 64 -events 100 -profile sdk >/dev/null
lport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
aport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$TMP/relay" --ingest-url "$SIM" --analytics-url "$SIM" --data-dir "$TMP/check" --listen "127.0.0.1:$lport" \
	--admin-listen "127.0.0.1:$aport" --credentials "$TMP/creds.yaml" --admin-token-file "$TMP/token" \
	--tracking-plan block --spool-min-free-bytes 0 --log-level warn >"$TMP/check.log" 2>&1 &
CHECKPID=$!
ready=""
for _ in $(seq 1 600); do
	if r=$(curl -sf "http://127.0.0.1:$aport/readyz" 2>/dev/null) && ! grep -q "tracking plan: not read yet" <<<"$r"; then
		ready=1
		break
	fi
	sleep 0.05
done
[ -n "$ready" ] || { echo "plan.sh: check relay not ready" >&2; cat "$TMP/check.log" >&2; exit 1; }
for f in "$TMP"/bodies/body-*.json; do
	curl -sf -o /dev/null -H 'Content-Type: application/json' --data-binary @"$f" "http://127.0.0.1:$lport/2/httpapi"
done
metric() { curl -sf "http://127.0.0.1:$aport/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" {s += $2} END {print s + 0}'; }
for _ in $(seq 1 600); do [ "$(metric relay_delivery_events_delivered_total)" -ge 6400 ] && break; sleep 0.1; done
v=$(metric relay_plan_violations_total) d=$(metric relay_delivery_events_delivered_total)
[ "$v" != 0 ] && curl -s -H "Authorization: Bearer bench-token" "http://127.0.0.1:$aport/relay/v1/plan?project=bench" | head -c 3000 >&2
kill "$CHECKPID"
wait "$CHECKPID" 2>/dev/null || true
if [ "$v" != 0 ] || [ "$d" -lt 6400 ]; then
	echo "plan.sh: the load breaks the plan ($v violations, $d of 6400 delivered)" >&2
	exit 1
fi
echo "plan.sh: 6400 events of the load checked against the plan in block mode: 0 violations, all delivered"
# The baseline: the same binary, the plan off (a later flag wins).
printf '#!/bin/sh\nexec %s "$@" --tracking-plan off\n' "$TMP/relay" >"$TMP/relay-off"
chmod +x "$TMP/relay-off"
[ -n "${PLAN_CHECK_ONLY:-}" ] && exit 0
if [ -n "${PLAN_PROFILE:-}" ]; then
	# A CPU profile of the relay in block mode (PLAN_PROFILE=off: with the
	# plan off) under bench/loadgen (32 connections, 100 SDK-shaped events
	# per request, 12 s), delivering to bench/sink, into $PLAN_PROFILE_DIR.
	(cd "$ROOT" && go build -o "$TMP/sink" ./bench/sink)
	"$TMP/sink" --addr-file "$TMP/sink.addr" >/dev/null 2>&1 &
	SINKPID=$!
	for _ in $(seq 1 200); do [ -s "$TMP/sink.addr" ] && break; sleep 0.05; done
	"$TMP/relay" --sync always --ingest-url "http://$(cat "$TMP/sink.addr")" --analytics-url "$SIM" --data-dir "$TMP/prof" \
		--listen "127.0.0.1:$lport" --admin-listen "127.0.0.1:$aport" --credentials "$TMP/creds.yaml" \
		--admin-token-file "$TMP/token" --tracking-plan "$PLAN_PROFILE" --log-level warn >"$TMP/prof.log" 2>&1 &
	PROFPID=$!
	for _ in $(seq 1 600); do
		r=$(curl -sf "http://127.0.0.1:$aport/readyz" 2>/dev/null) && ! grep -q "tracking plan: not read yet" <<<"$r" && break
		sleep 0.05
	done
	mkdir -p "${PLAN_PROFILE_DIR:=.}"
	curl -sf -H "Authorization: Bearer bench-token" -o "$PLAN_PROFILE_DIR/cpu-$PLAN_PROFILE.pprof" \
		"http://127.0.0.1:$aport/debug/pprof/profile?seconds=10" &
	PROF=$!
	"$TMP/loadgen" -url "http://127.0.0.1:$lport/2/httpapi" -c 32 -events 100 -profile sdk -duration 12s
	wait "$PROF"
	kill "$PROFPID" "$SINKPID"
	wait "$PROFPID" "$SINKPID" 2>/dev/null || true
	exit 0
fi
"$ROOT/bench/compare.sh" --targets "always base-always" --base-bin "${PLAN_BASE_BIN:-$TMP/relay-off}" \
	--relay-args "--tracking-plan ${PLAN_MODE:-block} --credentials $TMP/creds.yaml --admin-token-file $TMP/token --analytics-url $SIM" "$@"
