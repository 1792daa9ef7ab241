#!/usr/bin/env bash
# seccomp.sh TREE NAME: generates the precompiled seccomp programs of the
# sentry and of the gofer for the gVisor source tree TREE (tools/seccompgen)
# and writes build/seccomp/NAME.json, a `go build -overlay` file that puts
# them into TREE's runsc/boot/filter/filter_precompiled.go and
# runsc/fsgofer/filter/filter_precompiled.go (the generated files are
# NAME.go.txt and NAME-gofer.go.txt, so that `go vet ./...` of this module
# skips them); where TREE is the fork's, with the systrap stubs' programs in
# pkg/sentry/platform/systrap/stub_seccomp_precompiled.go too
# (tools/seccompgen -for systrap, built with -tags forkvisor_tree;
# NAME-systrap.go.txt). Cached on the content of the
# sources the programs come from.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tree=$(cd "$1" && pwd)
name=$2
out=$top/build/seccomp
mkdir -p "$out"
# The key covers the generator, the module it runs in, and the packages the
# two filter configurations import.
key=$( (go version; cd "$top" && sha256sum tools/seccomp.sh tools/seccompgen/*.go go.mod go.sum; cd "$tree" && sha256sum go.mod && find runsc/boot/filter runsc/fsgofer/filter pkg/seccomp pkg/bpf pkg/abi/linux pkg/sentry/platform pkg/sentry/devices pkg/sentry/socket pkg/tcpip/link/fdbased runsc/config -name '*.go' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)
if [ -f "$out/$name.key" ] && [ "$(cat "$out/$name.key")" = "$key" ] && [ -f "$out/$name.json" ] && [ -f "$out/$name.go.txt" ] && [ -f "$out/$name-gofer.go.txt" ] &&
	{ [ ! -f "$tree/pkg/sentry/platform/systrap/stub_seccomp_precompiled.go" ] || [ -f "$out/$name-systrap.go.txt" ]; }; then
	exit 0
fi
# A failed run leaves no key and no overlay, so that the next one starts
# over instead of building with a stale or missing file.
rm -f "$out/$name.key" "$out/$name.json"
# Run the generator against TREE: our module with gvisor.dev/gvisor
# replaced by TREE.
sed "\$a replace gvisor.dev/gvisor => $tree" "$top/go.mod" > "$out/$name.mod"
cp "$top/go.sum" "$out/$name.sum"
sentry=runsc/boot/filter/filter_precompiled.go
gofer=runsc/fsgofer/filter/filter_precompiled.go
stubs=pkg/sentry/platform/systrap/stub_seccomp_precompiled.go
tags=
if [ -f "$tree/$stubs" ]; then
	tags=forkvisor_tree
fi
gen=$(mktemp "$out/$name-seccompgen.XXXXXX")
trap 'rm -f "$gen"' EXIT
(cd "$top" && go build -modfile="$out/$name.mod" -tags "$tags" -o "$gen" ./tools/seccompgen)
"$gen" -for sentry -in "$tree/$sentry" -out "$out/$name.go.txt"
"$gen" -for gofer -in "$tree/$gofer" -out "$out/$name-gofer.go.txt"
replace=$(printf '"%s": "%s", "%s": "%s"' "$tree/$sentry" "$out/$name.go.txt" "$tree/$gofer" "$out/$name-gofer.go.txt")
rm -f "$out/$name-systrap.go.txt"
if [ -n "$tags" ]; then
	"$gen" -for systrap -in "$tree/$stubs" -out "$out/$name-systrap.go.txt"
	replace="$replace, $(printf '"%s": "%s"' "$tree/$stubs" "$out/$name-systrap.go.txt")"
fi
printf '{"Replace": {%s}}\n' "$replace" > "$out/$name.json.tmp"
mv "$out/$name.json.tmp" "$out/$name.json"
echo "$key" > "$out/$name.key"
