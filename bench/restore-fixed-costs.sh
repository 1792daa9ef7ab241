#!/bin/bash
# restore-fixed-costs.sh DIR...: from the runsc debug logs that
# `forkbench -log-dir` keeps (one DIR per runtime, e.g.
# /tmp/fvlogs/prestarted-forkvisor), print the medians of four fixed costs
# of a plain `runsc restore` (one that creates its sandbox, not --paused), in ms:
#   n         the plain restores found (the other columns are medians of
#             those whose logs have the lines they need)
#   join      runsc's move into the container's cgroup: the first "Joining
#             cgroup" line to the first line after that is not cgroup.go's
#             (where runsc joins by writing cgroup.procs)
#   boot      "Sandbox started" to runsc restore's "Restore: IMAGE" line,
#             which it logs once the container is created, before it sends
#             the Restore RPC: the sandbox's boot, plus, where runsc leaves
#             the cgroup before going on, that move
#   cpuid     the sandbox's "boot subcommand dispatched" to "CPUID initialized"
#   seccheck  the sandbox's "resolved mounts read" to "seccheck initialized"
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 DIR..." >&2; exit 2; }
median() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print "-"; else printf "%.1f", (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
# secs FILE PATTERN: the time of day, in seconds, of FILE's first line
# matching PATTERN (runsc's log lines carry no date: a run across midnight
# prints nonsense).
secs() { awk -v pat="$2" '$0 ~ pat {split($2,t,":"); printf "%.6f\n", t[1]*3600+t[2]*60+t[3]; exit}' "$1"; }
# nanos FILE MILESTONE: the unix nanos at which runsc's timer logged MILESTONE.
nanos() { { grep -m1 "reached midpoint $2 at" "$1" || true; } | sed 's/.*unix nanos: \([0-9]*\).*/\1/'; }
# joinms FILE: the join, in ms (empty if FILE has no "Joining cgroup" line).
joinms() {
	awk '{split($2,t,":"); s=t[1]*3600+t[2]*60+t[3]}
		!on && /Joining cgroup/ {on=1; a=s; next}
		on && !/cgroup\.go:/ {printf "%.3f\n", (s-a)*1000; exit}' "$1"
}
printf '%-28s %5s %8s %6s %6s %9s\n' dir n join boot cpuid seccheck
for dir in "$@"; do
	join=() rpc=() cpu=() sec=()
	for r in "$dir"/*.restore.txt; do
		grep -q "Creating new sandbox" "$r" || continue
		grep -q -- "--paused" "$r" && continue
		b=${r%.restore.txt}.boot.txt
		s0=$(secs "$r" "Sandbox started, PID"); s1=$(secs "$r" "restore.go:[0-9]+[]] Restore: ")
		j=$(joinms "$r"); [ -n "$j" ] && join+=("$j")
		[ -n "$s0" ] && [ -n "$s1" ] && rpc+=("$(awk -v a="$s0" -v b="$s1" 'BEGIN{print (b-a)*1000}')")
		if [ -f "$b" ]; then
			c0=$(nanos "$b" "boot subcommand dispatched"); c1=$(nanos "$b" "CPUID initialized")
			k0=$(nanos "$b" "resolved mounts read"); k1=$(nanos "$b" "seccheck initialized")
			[ -n "$c0" ] && [ -n "$c1" ] && cpu+=("$(awk -v a="$c0" -v b="$c1" 'BEGIN{print (b-a)/1e6}')")
			[ -n "$k0" ] && [ -n "$k1" ] && sec+=("$(awk -v a="$k0" -v b="$k1" 'BEGIN{print (b-a)/1e6}')")
		fi
	done
	printf '%-28s %5d %8s %6s %6s %9s\n' "$(basename "$dir")" "${#rpc[@]}" \
		"$(printf '%s\n' "${join[@]}" | grep . | median)" "$(printf '%s\n' "${rpc[@]}" | grep . | median)" \
		"$(printf '%s\n' "${cpu[@]}" | grep . | median)" "$(printf '%s\n' "${sec[@]}" | grep . | median)"
done
