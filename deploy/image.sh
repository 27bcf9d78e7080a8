#!/usr/bin/env bash
# Builds the relay's container image (deploy/Containerfile) with buildah,
# without pulling anything: the binary is built here by the local Go
# toolchain (CGO_ENABLED=0, static), then copied onto an empty base.
#
# Usage: bash deploy/image.sh [--tag NAME] [--smoke] [--oci-archive FILE] [--temp-store]
#   --tag NAME          image name (default localhost/relay:<git describe>)
#   --smoke             then run the image's /relay out of the built image's
#                       filesystem: `relay version`, and a short serve on
#                       127.0.0.1 answering /healthz and /readyz
#   --oci-archive FILE  also write the image as an OCI archive (for
#                       `podman load`, `docker load`, `skopeo copy`)
#   --temp-store        build in a temporary image store removed at the end
#                       (CI: nothing is left behind); without it the image
#                       stays in the machine's container storage, where
#                       `podman run NAME` finds it
# Environment: VERSION (stamped into the binary; default: git describe).
#
# Needs buildah (Debian: apt-get install buildah), root or a user namespace,
# and /etc/ssl/certs/ca-certificates.crt (Debian: ca-certificates).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tag="" smoke=0 archive="" temp=0
while [[ $# -gt 0 ]]; do
	case "$1" in
	--tag) tag="$2"; shift 2 ;;
	--smoke) smoke=1; shift ;;
	--oci-archive) archive="$2"; shift 2 ;;
	--temp-store) temp=1; shift ;;
	*) echo "image.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
version="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
tag="${tag:-localhost/relay:${version//+/-}}"

for tool in buildah go; do
	command -v "$tool" >/dev/null || { echo "image.sh: $tool not found (buildah: apt-get install buildah)" >&2; exit 1; }
done
ca=/etc/ssl/certs/ca-certificates.crt
[[ -r $ca ]] || { echo "image.sh: $ca missing (apt-get install ca-certificates): HTTPS upstreams need it" >&2; exit 1; }

work="$(mktemp -d)"
cleanup() {
	if [[ -n "${ctr:-}" ]]; then b umount "$ctr" >/dev/null 2>&1 || true; b rm "$ctr" >/dev/null 2>&1 || true; fi
	[[ -n "${pid:-}" ]] && kill "$pid" 2>/dev/null || true
	rm -rf "$work" # with --temp-store, the image store too
}
trap cleanup EXIT
if [[ $temp == 1 ]]; then
	# vfs needs no overlay mounts: it works in an unprivileged container.
	b() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
else
	b() { buildah "$@"; }
fi

ctx="$work/context"
mkdir -p "$ctx/data"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version -X main.revision=$revision" -o "$ctx/relay" ./cmd/relay
cp "$ca" "$ctx/ca-certificates.crt"
b bud --quiet --layers=false -f deploy/Containerfile -t "$tag" "$ctx" >/dev/null
if [[ $temp == 1 ]]; then
	echo "built $tag (in a temporary store, removed at exit)"
else
	echo "built $tag (in buildah's container storage: podman run $tag)"
fi
b inspect --format 'user={{.OCIv1.Config.User}} entrypoint={{.OCIv1.Config.Entrypoint}} ports={{.OCIv1.Config.ExposedPorts}} volumes={{.OCIv1.Config.Volumes}} env={{.OCIv1.Config.Env}}{{"\n"}}' "$tag"
if [[ -n $archive ]]; then
	b push --quiet "$tag" "oci-archive:$archive:$tag" >/dev/null
	echo "wrote $archive"
fi
[[ $smoke == 1 ]] || exit 0

# Smoke test: the image's own files, run here (no container runtime needed).
fail() { echo "image smoke test: FAIL: $*" >&2; exit 1; }
user="$(b inspect --format '{{.OCIv1.Config.User}}' "$tag")"
[[ $user =~ ^[0-9]+(:[0-9]+)?$ && ${user%%:*} != 0 ]] || fail "USER $user: want a numeric non-root user"
env="$(b inspect --format '{{.OCIv1.Config.Env}}' "$tag")"
for want in RELAY_LISTEN=0.0.0.0:8080 RELAY_ADMIN_LISTEN=0.0.0.0:8081 RELAY_ADMIN_TOKEN_FILE=/run/secrets/relay-admin-token RELAY_DATA_DIR=/data; do
	[[ $env == *"$want"* ]] || fail "ENV lacks $want"
done
ports="$(b inspect --format '{{.OCIv1.Config.ExposedPorts}}' "$tag")"
[[ $ports == *8080/tcp* && $ports == *8081/tcp* ]] || fail "EXPOSE: $ports"
[[ "$(b inspect --format '{{.OCIv1.Config.Volumes}}' "$tag")" == *"/data"* ]] || fail "/data is not a VOLUME"
ctr="$(b from --quiet "$tag")"
mnt="$(b mount "$ctr")"
[[ ! -e $mnt/bin/sh ]] || fail "the image has a shell"
[[ "$(stat -c %u "$mnt/data")" == "${user%%:*}" ]] || fail "/data is not owned by the relay's user"
file_out="$(od -An -c -N4 "$mnt/relay" | tr -d ' ')"
[[ $file_out == *ELF* ]] || fail "/relay is not an ELF binary"
if command -v readelf >/dev/null; then
	headers="$(readelf -l "$mnt/relay")" || fail "readelf /relay"
	! grep -q INTERP <<<"$headers" || fail "/relay is dynamically linked"
fi
[[ "$("$mnt/relay" --version)" == "relay "* ]] || fail "relay --version"
[[ $revision == unknown || "$("$mnt/relay" --version)" == *"revision $revision"* ]] || fail "relay --version does not name revision $revision"
"$mnt/relay" version
# Closed by default: the image's admin listener (0.0.0.0) without its
# token file is refused.
set +e
out="$(env -i RELAY_ADMIN_LISTEN=0.0.0.0:8081 "$mnt/relay" config check 2>&1)"
code=$?
set -e
[[ $code == 2 && $out == *"not a loopback address"* ]] || fail "admin-listen 0.0.0.0 without a token: exit $code: $out"

# A short serve on loopback (the image's 0.0.0.0 is overridden: this is the
# CI machine's network), in sandbox mode, on free ports read from its log.
mkdir -p "$work/data"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/admin.token"
chmod 600 "$work/admin.token"
RELAY_LISTEN=127.0.0.1:0 RELAY_ADMIN_LISTEN=127.0.0.1:0 RELAY_DATA_DIR="$work/data" RELAY_SPOOL_MIN_FREE_BYTES=0 RELAY_LOG_FORMAT=json \
	RELAY_ADMIN_TOKEN_FILE="$work/admin.token" "$mnt/relay" >"$work/relay.log" 2>&1 &
pid=$!
addr() { sed -n 's/.*"msg":"'"$1"' listening","addr":"\([0-9.:]*\)".*/\1/p' "$work/relay.log" | head -1; }
ok=0
for _ in $(seq 1 100); do
	adm="$(addr admin)" ing="$(addr ingest)"
	if [[ -n $adm && -n $ing ]] && curl -fsS "http://$adm/readyz" >/dev/null 2>&1; then ok=1; break; fi
	sleep 0.1
done
[[ $ok == 1 ]] || { cat "$work/relay.log" >&2; fail "/readyz did not answer 200 within 10s"; }
# Each answer is read whole before it is matched: `curl | grep -q` fails
# under pipefail when grep stops reading early (curl: (23)).
body="$(curl -fsS "http://$adm/healthz")" || fail "/healthz"
grep -q ok <<<"$body" || fail "/healthz"
body="$(curl -fsS "http://$adm/metrics")" || fail "/metrics"
grep -q '^relay_build_info{' <<<"$body" || fail "relay_build_info missing from /metrics"
body="$(curl -fsS -X POST "http://$ing/2/httpapi" -H 'Content-Type: application/json' \
	-d '{"api_key":"smoke-key","events":[{"event_type":"smoke","device_id":"device-smoke"}]}')" || fail "ingest"
grep -q '"code":200' <<<"$body" || fail "ingest"
code="$(curl -sS -o /dev/null -w '%{http_code}' "http://$adm/relay/v1/lanes")"
[[ $code == 401 ]] || fail "/relay/v1/lanes without the admin token: $code, want 401"
curl -fsS -H "Authorization: Bearer $(cat "$work/admin.token")" "http://$adm/relay/v1/lanes" >/dev/null || fail "/relay/v1/lanes with the admin token"
kill -TERM "$pid"
wait "$pid" || fail "relay exited $? on SIGTERM, want 0"
pid=""
echo "image smoke test: ok ($tag: --version, admin closed by default, serve, /healthz, /readyz, /metrics, ingest, admin token, SIGTERM exit 0)"
