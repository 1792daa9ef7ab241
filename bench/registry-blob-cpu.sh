#!/bin/bash
# registry-blob-cpu.sh: how much CPU the loopback registry of the tests and
# benchmarks (Debian's docker-registry, tools/registry.sh) spends serving one
# 2 MiB blob, the size of a base block. Starts a registry like
# internal/ociregistry does (filesystem storage, 127.0.0.1:5999), pushes a
# random 2 MiB blob with a monolithic upload, then GETs it N times (default
# 50) and prints the registry's CPU time (utime + stime) per GET.
set -euo pipefail
N=${1:-50}
BIN=${REGISTRY_BIN:-$(dirname "$0")/../build/registry/usr/bin/docker-registry}
D=$(mktemp -d)
trap 'kill $PID 2>/dev/null || true; rm -rf "$D"' EXIT
cat > "$D/config.yml" <<EOC
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $D/storage
http:
  addr: 127.0.0.1:5999
EOC
"$BIN" serve "$D/config.yml" > "$D/log" 2>&1 &
PID=$!
for _ in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:5999/v2/ && break; sleep 0.1; done
head -c 2097152 /dev/urandom > "$D/blob"
DG=sha256:$(sha256sum "$D/blob" | cut -d' ' -f1)
LOC=$(curl -sf -i -X POST http://127.0.0.1:5999/v2/t/blobs/uploads/ | sed -n 's/^[Ll]ocation: *//p' | tr -d '\r')
case "$LOC" in http*) ;; *) LOC=http://127.0.0.1:5999$LOC ;; esac
case "$LOC" in *\?*) SEP='&' ;; *) SEP='?' ;; esac
curl -sf -X PUT -H 'Content-Type: application/octet-stream' --data-binary @"$D/blob" "$LOC${SEP}digest=$DG" -o /dev/null
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
T0=$(ticks); S=$(date +%s%N)
for _ in $(seq "$N"); do curl -sf -o /dev/null "http://127.0.0.1:5999/v2/t/blobs/$DG"; done
E=$(date +%s%N); T1=$(ticks)
HZ=$(getconf CLK_TCK)
echo "$N GETs of a 2 MiB blob: $(( (E - S) / 1000000 )) ms wall, registry CPU $(( (T1 - T0) * 1000 / HZ )) ms ($(( (T1 - T0) * 1000000 / HZ / N )) us per GET)"
