#!/usr/bin/env bash
# restore-ab.sh RUNSC_A RUNSC_B [N] compares two runsc builds phase by phase
# on the same image: it parks a 256 MiB tick workload with RUNSC_A
# (checkpoint --shared-base), restores it once with each build (A's first
# restore learns the base's write set, B's does not), then N more times each
# (default 10), alternating, with debug logs, and prints bench/restorephases
# for both (first restore and the median of the others, phase by phase).
# Each clone is destroyed once it has printed its first tick. Root; bin/tick
# must be built (make all). Sandboxes run under a temporary --root and
# --base-store, removed at the end.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
	echo "usage: restore-ab.sh RUNSC_A RUNSC_B [N] (both executable)" >&2
	exit 2
fi
a=$(realpath "$1")
b=$(realpath "$2")
n=${3:-10}
work=$(mktemp -d)
G=(--root "$work/root" --network=none --platform=systrap --base-store="$work/bases")
cleanup() {
	for r in "$a" "$b"; do
		for c in $("$r" "${G[@]}" list -q 2>/dev/null); do "$r" "${G[@]}" delete -force "$c" >/dev/null 2>&1 || true; done
	done
	umount "$work/root/null-netns" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
mkdir -p "$work/bundle/rootfs" "$work/img" "$work/logs/a" "$work/logs/b"
cp "$top/bin/tick" "$work/bundle/rootfs/tick"
(cd "$work/bundle" && "$a" spec -- /tick -mib 256 -interval 50ms -check-mib 4 &&
	sed -i 's/"terminal": true/"terminal": false/' config.json)
"$a" "${G[@]}" run --bundle "$work/bundle" --detach src >"$work/src.out" 2>&1
for _ in $(seq 500); do grep -q 'tick=' "$work/src.out" && break; sleep 0.02; done
grep -q 'tick=' "$work/src.out" || { echo "restore-ab: the source printed no tick" >&2; cat "$work/src.out" >&2; exit 1; }
"$a" "${G[@]}" checkpoint --shared-base --image-path "$work/img" src
"$a" "${G[@]}" delete -force src >/dev/null 2>&1 || true

# restore BUILD LOGDIR ID: restores a clone, waits for its first tick line,
# and destroys it.
restore() {
	"$1" "${G[@]}" --debug --debug-log="$2/" restore --image-path "$work/img" --bundle "$work/bundle" --detach "$3" >"$work/$3.out" 2>&1 &
	local pid=$!
	for _ in $(seq 1000); do grep -q 'tick=' "$work/$3.out" && break; sleep 0.01; done
	wait "$pid" || { echo "restore-ab: runsc restore of $3 failed" >&2; cat "$work/$3.out" >&2; exit 1; }
	grep -q 'tick=' "$work/$3.out" || { echo "restore-ab: $3 printed no tick" >&2; cat "$work/$3.out" >&2; exit 1; }
	"$1" "${G[@]}" delete -force "$3" >/dev/null 2>&1
}
for i in $(seq 0 "$n"); do
	restore "$a" "$work/logs/a" "a$i"
	restore "$b" "$work/logs/b" "b$i"
done
echo "A: $a"
echo "B: $b"
(cd "$top" && go run ./bench/restorephases "$work/logs/a" "$work/logs/b")
