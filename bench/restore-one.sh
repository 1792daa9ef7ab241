#!/usr/bin/env bash
# restore-one.sh PCT N RUNSC [RUNSC...] measures restore -> first tick of
# clones restored one at a time, with nothing else running: for each runsc
# build, it parks a 256 MiB tick workload that stores into PCT% of its heap
# pages (scattered) before every tick, then restores N+1 clones of each
# image, alternating between builds and modes, and destroys each clone once
# it has printed its first tick. A build that has `checkpoint --shared-base`
# parks with it, into a base store of its own (its first restore learns the
# base's write set, so it is reported apart, and its clone is destroyed once
# the set is written); one that has not (upstream)
# parks plainly and restores in both of its modes, plain and --background.
# It prints each runtime's first restore, the median of the other N and
# every sample (ms). Root; bin/tick must be built (make all). Sandboxes run
# under temporary --root and --base-store directories, removed at the end.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 3 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -gt 100 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
	echo "usage: restore-one.sh PCT(0-100) N(>=1) RUNSC [RUNSC...]" >&2
	exit 2
fi
pct=$1 n=$2
shift 2
builds=()
for r in "$@"; do
	[ -x "$r" ] || { echo "restore-one: $r is not executable" >&2; exit 2; }
	builds+=("$(realpath "$r")")
done

# gargs I sets G to the global flags of build I.
gargs() {
	G=(--root "$work/root$1" --network=none --platform=systrap)
	if [ -n "${shared[$1]:-}" ]; then
		G+=(--base-store="$work/bases$1")
	fi
}
declare -A shared
work=
cleanup() {
	[ -n "$work" ] || return 0
	for i in "${!builds[@]}"; do
		gargs "$i"
		for c in $("${builds[$i]}" "${G[@]}" list -q 2>/dev/null); do "${builds[$i]}" "${G[@]}" delete -force "$c" >/dev/null 2>&1 || true; done
		umount "$work/root$i/null-netns" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
work=$(mktemp -d)

# waittick FILE: returns once FILE has a tick line, or fails after 60 s.
waittick() {
	timeout 60 bash -c 'until grep -q "tick=" "$0"; do sleep 0.01; done' "$1"
}

# waitwriteset STORE: returns once a base in the base store STORE has a
# non-empty write set, or fails after 15 s.
waitwriteset() {
	timeout 15 bash -c 'until [ -n "$(find "$0" -name "*.writeset" -size +0 2>/dev/null)" ]; do sleep 0.05; done' "$1" &&
		sleep 0.2 # the learner writes the set, then closes it
}

mkdir -p "$work/bundle/rootfs"
cp "$top/bin/tick" "$work/bundle/rootfs/tick"
(cd "$work/bundle" && "${builds[0]}" spec -- /tick -mib 256 -interval 50ms -write-pct "$pct" &&
	sed -i 's/"terminal": true/"terminal": false/' config.json)
runtimes=() # "index mode"
for i in "${!builds[@]}"; do
	b=${builds[$i]}
	ck=() modes=(plain background)
	help=$("$b" checkpoint --help 2>&1 || true)
	if [[ $help == *-shared-base* ]]; then
		shared[$i]=1 ck=(--shared-base) modes=(shared-base)
	fi
	gargs "$i"
	"$b" "${G[@]}" run --bundle "$work/bundle" --detach src >"$work/src$i.out" 2>&1
	waittick "$work/src$i.out" || { echo "restore-one: the source of $b printed no tick" >&2; exit 1; }
	"$b" "${G[@]}" checkpoint "${ck[@]}" --image-path "$work/img$i" src
	"$b" "${G[@]}" delete -force src >/dev/null 2>&1 || true
	for m in "${modes[@]}"; do runtimes+=("$i $m"); done
done

declare -A samples
for k in $(seq 0 "$n"); do
	for rt in "${runtimes[@]}"; do
		read -r i m <<<"$rt"
		b=${builds[$i]}
		gargs "$i"
		rs=()
		[ "$m" = background ] && rs=(--background)
		id="c$k-$m"
		out="$work/$i-$id.out"
		: >"$out"
		t0=$(date +%s%N)
		"$b" "${G[@]}" restore "${rs[@]}" --image-path "$work/img$i" --bundle "$work/bundle" --detach "$id" >>"$out" 2>&1 &
		pid=$!
		if ! waittick "$out"; then
			kill "$pid" 2>/dev/null || true
			wait "$pid" || true
			echo "restore-one: $b ($m) clone $k printed no tick" >&2
			cat "$out" >&2
			exit 1
		fi
		t1=$(date +%s%N)
		wait "$pid" || { echo "restore-one: runsc restore of $id failed" >&2; cat "$out" >&2; exit 1; }
		samples[$rt]+="$(((t1 - t0) / 1000000)) "
		if [ "$k" = 0 ] && [ -n "${shared[$i]:-}" ]; then
			# Let the first clone finish learning the base's write set
			# (runsc ignores a set still being learned), off the clock.
			waitwriteset "$work/bases$i" || { echo "restore-one: $b's first clone wrote no write set" >&2; exit 1; }
		fi
		"$b" "${G[@]}" delete -force "$id" >/dev/null 2>&1
	done
done
echo "restore -> first tick, one clone at a time, 256 MiB heap, write-pct $pct (ms; first restore, then the median and samples of the other $n)"
for rt in "${runtimes[@]}"; do
	read -r i m <<<"$rt"
	read -r -a s <<<"${samples[$rt]}"
	rest=("${s[@]:1}")
	med=$(printf '%s\n' "${rest[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
	printf '%-40s %-12s first %6s  p50 %8s  samples %s\n' "${builds[$i]}" "$m" "${s[0]}" "$med" "${rest[*]}"
done
