#!/usr/bin/env bash
# check-patches.sh proves that patches/series applies to pristine upstream at
# the pin, that exporting the result reproduces patches/ byte for byte, and
# that the generated code it carries is what its .proto files generate.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$top/tools/tree.sh" "$tmp/gvisor"
"$top/tools/export-patches.sh" "$tmp/gvisor" "$tmp/patches" >/dev/null
"$top/tools/proto.sh" -check "$tmp/gvisor"
if ! diff -r "$top/patches" "$tmp/patches"; then
	echo "check-patches: re-exporting the series changes patches/ (see diff above)" >&2
	exit 1
fi
echo "check-patches: ok ($(grep -cv '^#' "$top/patches/series") patches apply to $(cat "$top/tools/PIN") and re-export identically)"
