#!/usr/bin/env bash
# seccomp.sh TREE NAME: generates the sentry's precompiled seccomp programs
# for the gVisor source tree TREE (tools/seccompgen) and writes
# build/seccomp/NAME.json, a `go build -overlay` file that puts them into
# TREE's runsc/boot/filter/filter_precompiled.go (the generated file is
# NAME.go.txt, so that `go vet ./...` of this module skips it). Cached on the content of
# the sources the programs come from.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tree=$(cd "$1" && pwd)
name=$2
out=$top/build/seccomp
mkdir -p "$out"
key=$( (go version; cd "$tree" && find runsc/boot/filter pkg/seccomp pkg/sentry/platform pkg/sentry/devices runsc/config -name '*.go' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)
if [ -f "$out/$name.key" ] && [ "$(cat "$out/$name.key")" = "$key" ] && [ -f "$out/$name.json" ]; then
	exit 0
fi
# Run the generator against TREE: our module with gvisor.dev/gvisor
# replaced by TREE.
sed "\$a replace gvisor.dev/gvisor => $tree" "$top/go.mod" > "$out/$name.mod"
cp "$top/go.sum" "$out/$name.sum"
(cd "$top" && go run -modfile="$out/$name.mod" ./tools/seccompgen -in "$tree/runsc/boot/filter/filter_precompiled.go" -out "$out/$name.go.txt")
printf '{"Replace": {"%s": "%s"}}\n' "$tree/runsc/boot/filter/filter_precompiled.go" "$out/$name.go.txt" > "$out/$name.json"
echo "$key" > "$out/$name.key"
