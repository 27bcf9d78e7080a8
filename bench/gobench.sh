#!/usr/bin/env bash
# bench/gobench.sh: the hot-path Go benchmarks with -benchmem -count N, and
# the median of every reported metric per benchmark (benchstat-like, no
# dependency). usage: bench/gobench.sh [count] [benchtime] [packages...]
# A benchmark whose name carries events=N or records=N also gets per-event
# figures derived from its medians: ns/event (wall time of an op over N;
# not CPU time when the benchmark runs in parallel), allocated B/event and
# allocs/event (B/op and allocs/op over N), the in-process side of the
# "bytes copied per event" that bench/compare.sh measures end to end.
set -euo pipefail
COUNT="${1:-5}"
BT="${2:-1s}"
shift $(($# > 2 ? 2 : $#))
PKGS=("$@")
[ ${#PKGS[@]} -eq 0 ] && PKGS=(./internal/event/ ./internal/spool/ ./internal/delivery/ ./internal/ingest/)
cd "$(dirname "$0")/.."
RAW="$(mktemp)"
trap 'rm -f "$RAW"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), go test -run '^\$' -bench . -benchmem -count $COUNT -benchtime $BT"
for p in "${PKGS[@]}"; do
	go test -run '^$' -bench . -benchmem -count "$COUNT" -benchtime "$BT" "$p" | tee -a "$RAW" >&2
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| benchmark | median of $COUNT: metrics |"
echo "|---|---|"
awk '/^Benchmark/ {
	name=$1; if (!(name in seen)) { seen[name]=1; order[++n]=name }
	for (i=3; i+1<=NF; i+=2) { k=name SUBSEP $(i+1); vals[k]=vals[k] " " $i; if (!((name,$(i+1)) in u)) { u[name,$(i+1)]=1; units[name]=units[name] " " $(i+1) } }
}
END {
	for (j=1; j<=n; j++) {
		name=order[j]; line=""
		m=split(units[name], us, " ")
		for (x=1; x<=m; x++) {
			c=split(vals[name SUBSEP us[x]], v, " ")
			for (a=1; a<=c; a++) for (b=a+1; b<=c; b++) if (v[b]+0 < v[a]+0) { t=v[a]; v[a]=v[b]; v[b]=t }
			med = (c%2) ? v[(c+1)/2] : (v[c/2]+v[c/2+1])/2
			line = line sprintf("%s%.4g %s", (x>1?", ":""), med, us[x])
			got[us[x]] = med
		}
		if (match(name, /(events|records)=[0-9]+/)) {
			per = substr(name, RSTART, RLENGTH); sub(/.*=/, "", per); per += 0
			if (per > 0) {
				derived = ""
				if (("ns/op" in got) && !("ns/event" in got)) derived = derived sprintf(", %.4g ns/event", got["ns/op"] / per)
				if ("B/op" in got) derived = derived sprintf(", %.4g allocated B/event", got["B/op"] / per)
				if ("allocs/op" in got) derived = derived sprintf(", %.4g allocs/event", got["allocs/op"] / per)
				line = line " (derived" substr(derived, 2) ")"
			}
		}
		delete got
		printf "| %s | %s |\n", name, line
	}
}' "$RAW"
