#!/usr/bin/env bash
# proto.sh [-check] [TREE] regenerates the Go code of the .proto files that
# the series adds to the tree (default build/gvisor) with tools/protogen, or
# with -check fails if the committed code differs from what they generate.
# A .proto that the tree does not have yet (an early prefix of the series)
# is skipped.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
check=
if [ "${1:-}" = -check ]; then
	check=-check
	shift
fi
tree=$(cd "${1:-$top/build/gvisor}" && pwd)
# PROTO=GO_IMPORT_PATH of the generated code.
protos=(
	pkg/sentry/pgalloc/pgalloc.proto=gvisor.dev/gvisor/pkg/sentry/pgalloc/pgalloc_metadata_go_proto
)
bin="$top/build/protogen"
(cd "$top/tools/protogen" && go build -o "$bin" .)
for p in "${protos[@]}"; do
	[ -f "$tree/${p%%=*}" ] || continue
	"$bin" $check -tree "$tree" "$p"
done
