#!/usr/bin/env bash
# restore-profile.sh [-n N] BUILD... takes a host-wide CPU profile (perf
# record -g, 2999 Hz) of bench/restoreone restoring N+1 clones of a 256 MiB
# tick workload with each runsc build in turn (alternating), and prints,
# per build, the samples of its sandboxes, gofers and helpers that pass
# through the fixed costs of a restore (bench/restoreprofile). Root; perf
# and bin/tick (make all). Example, two builds side by side:
#
#	bench/restore-profile.sh -n 20 /tmp/runsc-before bin/runsc
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
n=20
if [ "${1:-}" = -n ]; then
	n=$2
	shift 2
fi
[ $# -gt 0 ] || { echo "usage: $0 [-n N] BUILD..." >&2; exit 2; }
command -v perf >/dev/null || { echo "restore-profile: perf is not installed" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$top" && go build -o "$work/restoreone" ./bench/restoreone && go build -o "$work/restoreprofile" ./bench/restoreprofile)
(cd "$top" && perf record -q -a -g -F 2999 -o "$work/perf.data" -- "$work/restoreone" -n "$n" "$@") >"$work/restoreone.out" 2>&1 || { cat "$work/restoreone.out" >&2; exit 1; }
grep -E '^(restore|/|bin|[a-z])' "$work/restoreone.out" | grep -v '^\[' || true
(cd "$top" && perf script -i "$work/perf.data" --comm exe -F pid,ip,sym,dso 2>/dev/null | "$work/restoreprofile" "$@")
