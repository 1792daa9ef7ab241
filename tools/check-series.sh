#!/usr/bin/env bash
# check-series.sh builds and vets every prefix of the patch series: for each
# commit after `upstream` in the materialized tree, ./runsc and ./shim build
# (CGO_ENABLED=0), the packages the commit touches pass go vet (without
# the composites and unsafeptr analyzers, which upstream's own code fails;
# pkg/cpuid also without asmdecl, which its xgetbv assembly fails),
# and generated protobuf code is what its .proto generates (tools/proto.sh).
#
# The worktree is always build/check-series-worktree: Go's build cache keys
# a package's compilation by its directory too, so a new directory per run
# missed the cache for every prefix (a run took 36 minutes) and added a
# whole series of builds to it each time (77 GB over a few days here),
# where one fixed directory rebuilds only the prefixes that changed.
#
# Usage: tools/check-series.sh [TREE]   (default build/gvisor)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tree=${1:-$top/build/gvisor}
wt=$top/build/check-series-worktree
remove_worktree() {
	git -C "$tree" worktree remove --force "$wt" >/dev/null 2>&1 || true
	rm -rf "$wt"
	git -C "$tree" worktree prune
}
# A run that was killed left its worktree behind.
remove_worktree
trap remove_worktree EXIT
git -C "$tree" worktree add -q --detach "$wt" upstream
cd "$wt"
export CGO_ENABLED=0
n=0 fail=0
for c in $(git -C "$tree" rev-list --reverse upstream..HEAD); do
	n=$((n+1))
	git checkout -q --detach "$c"
	subj=$(git log -1 --format=%s)
	vet=$(git show --name-only --format= "$c" | grep '\.go$' | xargs -r -n1 dirname | sort -u |
		sed -e 's#^runsc/.*#runsc/...#' -e 's#^pkg/shim/.*#pkg/shim/...#' -e 's#^shim/.*#shim/...#' | sort -u | sed 's#^#./#' | tr '\n' ' ')
	printf 'check-series: %2d %s\n' "$n" "$subj"
	if ! go build -o /dev/null ./runsc || ! go build -o /dev/null ./shim; then
		echo "check-series: patch $n does not build: $subj" >&2
		fail=1
		continue
	fi
	if ! "$top/tools/proto.sh" -check . >/dev/null; then
		echo "check-series: patch $n has generated code that its .proto does not generate: $subj" >&2
		fail=1
	fi
	asm=
	case " $vet " in *" ./pkg/cpuid "*) vet=${vet//.\/pkg\/cpuid /} asm=./pkg/cpuid ;; esac
	if [ -n "${vet// /}" ] && ! go vet -composites=false -unsafeptr=false $vet; then
		echo "check-series: patch $n fails go vet ($vet): $subj" >&2
		fail=1
	fi
	if [ -n "$asm" ] && ! go vet -composites=false -unsafeptr=false -asmdecl=false $asm; then
		echo "check-series: patch $n fails go vet ($asm): $subj" >&2
		fail=1
	fi
done
[ "$fail" = 0 ] && echo "check-series: all $n prefixes build, vet and match their .proto files"
exit "$fail"
