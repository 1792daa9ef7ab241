#!/usr/bin/env bash
# profile-restore.sh [PCT] takes a CPU profile of the sentry during the first
# restore of a fresh shared base (the restore that learns the base's write
# set), for the tick workload storing into PCT% (default 30) of its 256 MiB
# heap every tick, and prints the top of it (cumulative). Root; bin/runsc
# and bin/tick must be built (make all). Sandboxes run under a temporary
# --root and --base-store, removed at the end.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
pct=${1:-30}
runsc=$top/bin/runsc
work=$(mktemp -d)
G=(--root "$work/root" --network=none --platform=systrap --base-store="$work/bases" --profile)
cleanup() {
	for c in src c1; do "$runsc" "${G[@]}" delete -force "$c" >/dev/null 2>&1 || true; done
	# runsc keeps a namespace for --network=none bind-mounted in its root.
	umount "$work/root/null-netns" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/bundle/rootfs" "$work/img"
cp "$top/bin/tick" "$work/bundle/rootfs/tick"
(cd "$work/bundle" && "$runsc" spec -- /tick -mib 256 -interval 100ms -write-pct "$pct" &&
	sed -i 's/"terminal": true/"terminal": false/' config.json)
"$runsc" "${G[@]}" run --bundle "$work/bundle" --detach src >"$work/src.out" 2>&1
sleep 4
"$runsc" "${G[@]}" checkpoint --shared-base --image-path "$work/img" src
"$runsc" "${G[@]}" delete -force src
"$runsc" "${G[@]}" restore --image-path "$work/img" --bundle "$work/bundle" --detach c1 >"$work/c1.out" 2>&1 &
for _ in $(seq 100); do "$runsc" "${G[@]}" state c1 >/dev/null 2>&1 && break; sleep 0.02; done
"$runsc" "${G[@]}" debug --profile-cpu="$work/cpu.prof" --duration=2s c1 >/dev/null
wait
# A writer's first tick can come after the profile ends.
for _ in $(seq 500); do grep -a -q 'tick=' "$work/c1.out" && break; sleep 0.02; done
grep -a -m1 -o 'tick=[0-9]* mib=[0-9]* sum=[a-z]*' "$work/c1.out" || { echo "profile-restore: the clone printed no tick" >&2; exit 1; }
(cd "$top/build/gvisor" && go tool pprof -top -cum "$runsc" "$work/cpu.prof" 2>/dev/null | sed -n '1,25p')
