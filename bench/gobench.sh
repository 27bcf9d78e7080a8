#!/usr/bin/env bash
# bench/gobench.sh: the hot-path Go benchmarks with -benchmem -count N, and
# the median of every reported metric per benchmark (benchstat-like, no
# dependency). usage: bench/gobench.sh [count] [benchtime] [packages...]
set -euo pipefail
COUNT="${1:-5}"
BT="${2:-1s}"
shift $(($# > 2 ? 2 : $#))
PKGS=("$@")
[ ${#PKGS[@]} -eq 0 ] && PKGS=(./internal/event/ ./internal/spool/ ./internal/batcher/ ./internal/ingest/)
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
		}
		printf "| %s | %s |\n", name, line
	}
}' "$RAW"
