#!/usr/bin/env bash
# flatten-table.sh runs pgalloc's flatten test (N MemoryFiles restored from one
# delta-only checkpoint over one base) for each N given and prints a table.
#
# Usage: tools/flatten-table.sh N...   (FLATTEN_BASE_MB, FLATTEN_DELTA_MB as in the test)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top/build/gvisor"
go test -c -o "$top/build/pgalloc.test" ./pkg/sentry/pgalloc/ >/dev/null
printf '%-4s %-9s %-10s %-10s %-10s %-7s %-7s %s\n' N base_MiB delta_MiB rss_MiB pss_MiB ratio ideal of_ideal
for n in "$@"; do
	line=$(FLATTEN_N=$n "$top/build/pgalloc.test" -test.run '^TestSharedBaseFlatten$' -test.v 2>/dev/null | grep '^FLATTEN ') || {
		echo "flatten-table: the flatten test failed for N=$n" >&2; exit 1; }
	eval "$(echo "${line#FLATTEN }" | tr ' ' '\n' | sed 's/^/f_/')"
	printf '%-4s %-9s %-10s %-10s %-10s %-7s %-7s %s\n' "$f_n" "$f_base_mib" "$f_delta_mib" "$f_rss_mib" "$f_pss_mib" "$f_ratio" "$f_ideal" \
		"$(awk -v r="$f_ratio" -v i="$f_ideal" 'BEGIN{printf "%.0f%%", 100*r/i}')"
done
