#!/usr/bin/env bash
# tree.sh materializes build/gvisor: pristine upstream at the pin as one
# commit, then every patch of patches/series applied with `git am`.
#
# Usage: tools/tree.sh [DEST]   (default build/gvisor)
# The destination is replaced. Fails (non-zero) if any patch does not apply.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$top/build/gvisor}
pin=$(cat "$top/tools/PIN")
mod=gvisor.dev/gvisor

dir=$(cd "$top" && GOFLAGS=-mod=mod go mod download -json "$mod@$pin" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "tree.sh: go mod download $mod@$pin gave no directory" >&2; exit 1; }

# Refuse to throw away work: a tree with uncommitted changes, or with commits
# that patches/ does not carry yet. FORCE=1 overrides.
if [ -d "$dest/.git" ] && [ "${FORCE:-0}" != 1 ]; then
	if [ -n "$(git -C "$dest" status --porcelain --untracked-files=all | grep -v ' \.forkvisor-series$')" ]; then
		echo "tree.sh: $dest has uncommitted changes or untracked files; commit and export them (make patches), remove them, or rerun with FORCE=1" >&2
		exit 1
	fi
	if git -C "$dest" rev-parse -q --verify upstream >/dev/null; then
		chk=$(mktemp -d)
		"$top/tools/export-patches.sh" "$dest" "$chk" >/dev/null
		if ! diff -rq "$top/patches" "$chk" >/dev/null 2>&1; then
			rm -rf "$chk"
			echo "tree.sh: $dest has commits that differ from patches/; export them (make patches) or rerun with FORCE=1" >&2
			exit 1
		fi
		rm -rf "$chk"
	fi
fi
rm -rf "$dest"
mkdir -p "$dest"
cp -a "$dir/." "$dest/"
chmod -R u+w "$dest"
export GIT_AUTHOR_NAME=forkvisor GIT_AUTHOR_EMAIL=forkvisor@localhost
export GIT_COMMITTER_NAME=forkvisor GIT_COMMITTER_EMAIL=forkvisor@localhost
export GIT_AUTHOR_DATE="2026-09-05T03:51:02Z" GIT_COMMITTER_DATE="2026-09-05T03:51:02Z"
git -C "$dest" init -q -b forkvisor
git -C "$dest" config user.name forkvisor
git -C "$dest" config user.email forkvisor@localhost
git -C "$dest" config core.autocrlf false
# The Makefile's stamp is not part of the tree.
echo .forkvisor-series >>"$dest/.git/info/exclude"
git -C "$dest" add -A -f
git -C "$dest" commit -q -m "upstream $mod@$pin"
git -C "$dest" tag upstream

n=0
while read -r p; do
	case "$p" in ''|'#'*) continue ;; esac
	if ! git -C "$dest" am -q --keep-cr --committer-date-is-author-date "$top/patches/$p"; then
		echo "tree.sh: patch $p does not apply to $mod@$pin" >&2
		git -C "$dest" am --abort || true
		exit 1
	fi
	n=$((n+1))
done < <(cat "$top/patches/series" 2>/dev/null || true)
echo "tree.sh: $dest = $mod@$pin + $n patches"
