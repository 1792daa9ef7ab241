#!/usr/bin/env bash
# pyrootfs.sh builds build/pyrootfs: a minimal root filesystem of this
# machine's own Debian (or Ubuntu) release with CPython 3 and its standard
# library (asyncio, json), for the pyagent workload (test/workloads/pyagent).
#
# debootstrap --variant=minbase, suite = VERSION_CODENAME of /etc/os-release,
# mirror = the first apt source of this machine that serves that suite, plus
# python3-minimal and libpython3-stdlib (the interpreter and the full
# standard library, without python3's extras). It downloads about 40 MB.
#
# Cached: nothing is done while build/pyrootfs/.forkvisor-complete holds this
# script's sha256. The tree is built in a temporary directory under build/
# and renamed into place at the end, so an interrupted build never leaves a
# partial build/pyrootfs (a leftover temporary directory is removed by the
# next run). Every failure exits non-zero with the reason.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=$top/build
dest=$build/pyrootfs
stamp=.forkvisor-complete
sum=$(sha256sum "$0" | cut -d' ' -f1)

log() { echo "pyrootfs.sh: $*"; }
fail() {
	echo "pyrootfs.sh: $*" >&2
	exit 1
}

if [ -f "$dest/$stamp" ] && [ "$(cat "$dest/$stamp")" = "$sum" ]; then
	log "up to date: $dest"
	exit 0
fi
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap) to build $dest"

# Suite: this machine's release.
# shellcheck disable=SC1091
. /etc/os-release
case " ${ID:-} ${ID_LIKE:-} " in
*" debian "* | *" ubuntu "*) ;;
*) fail "this machine runs ${PRETTY_NAME:-${ID:-an unknown distribution}}; only Debian and Ubuntu hosts are supported (debootstrap of the host's own release)" ;;
esac
suite=${VERSION_CODENAME:-}
[ -n "$suite" ] || fail "${PRETTY_NAME:-$ID} has no VERSION_CODENAME in /etc/os-release"

# Mirror: the first enabled apt source (deb822 or one-line format) that
# serves exactly $suite.
mirror=
keyring=
shopt -s nullglob
for f in /etc/apt/sources.list.d/*.sources; do
	read -r mirror keyring < <(awk -v suite="$suite" '
		function flush() {
			if (!found && types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && enabled != "no" && uri != "") {
				print uri, key; found = 1
			}
			types = suites = uri = key = enabled = ""
		}
		/^[ \t]*$/ { flush(); next }
		/^#/ { next }
		tolower($1) == "types:" { $1 = ""; types = $0 }
		tolower($1) == "suites:" { $1 = ""; suites = $0 }
		tolower($1) == "uris:" { uri = $2 }
		tolower($1) == "signed-by:" && $2 ~ /^\// { key = $2 }
		tolower($1) == "enabled:" { enabled = tolower($2) }
		END { flush() }' "$f") || true
	[ -z "$mirror" ] || break
done
if [ -z "$mirror" ]; then
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		mirror=$(awk -v suite="$suite" '
			$1 == "deb" {
				i = 2
				if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
				if ($(i + 1) == suite) { print $i; exit }
			}' "$f")
		[ -z "$mirror" ] || break
	done
fi
[ -n "$mirror" ] || fail "no apt source in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources serves suite $suite"

if ! command -v debootstrap >/dev/null 2>&1; then
	log "installing debootstrap"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null || fail "apt-get update failed"
	apt-get install -y -q debootstrap >/dev/null || fail "apt-get install debootstrap failed"
fi
[ -e "/usr/share/debootstrap/scripts/$suite" ] || fail "this debootstrap does not know suite $suite (${PRETTY_NAME:-$ID})"

mkdir -p "$build"
# One build at a time; the lock also makes removing leftovers safe.
exec 9>"$build/.pyrootfs.lock"
flock 9

# unmount_under DIR: lazily unmount everything debootstrap may have mounted
# at or below DIR (proc, sys, bind mounts of /dev), deepest first, so that
# removing DIR never reaches into a host filesystem.
unmount_under() {
	awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo |
		sort -r | while read -r m; do umount -l "$m" || true; done
}
remove_tree() {
	unmount_under "$1"
	rm -rf --one-file-system "$1"
}
for old in "$build"/.pyrootfs.tmp.* "$build"/.pyrootfs.old.*; do
	[ -d "$old" ] || continue
	log "removing leftover $old"
	remove_tree "$old"
done

tmp=$(mktemp -d "$build/.pyrootfs.tmp.XXXXXX")
trap 'remove_tree "$tmp"' EXIT
chmod 755 "$tmp"

start=$(date +%s)
log "debootstrap $suite (minbase + python3-minimal, libpython3-stdlib) from $mirror into $tmp"
opts=(--variant=minbase --include=python3-minimal,libpython3-stdlib)
[ -z "$keyring" ] || opts+=(--keyring="$keyring")
# debootstrap prints one line per step (I: Retrieving ..., I: Extracting ...).
if ! debootstrap "${opts[@]}" "$suite" "$tmp" "$mirror" 2>&1 | sed -u 's/^/pyrootfs.sh: debootstrap: /'; then
	[ ! -f "$tmp/debootstrap/debootstrap.log" ] || tail -n 20 "$tmp/debootstrap/debootstrap.log" >&2
	fail "debootstrap $suite from $mirror failed"
fi
unmount_under "$tmp"

# Check the interpreter and the modules the agent needs. Importing them also
# writes their bytecode (python3's py3compile is not installed, and the
# sandbox mounts the tree read-only), so the agent starts without compiling.
py=$(chroot "$tmp" /usr/bin/env -i PATH=/usr/bin:/bin /usr/bin/python3 -c \
	'import argparse, asyncio, gc, json, os, random, sys, time; print(sys.version.split()[0])') ||
	fail "python3 in the new rootfs cannot import asyncio and json"
# Nothing in a sandbox reads these.
rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp"/debootstrap \
	"$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* "$tmp"/usr/share/locale/* "$tmp"/usr/share/info/*
echo "$sum" >"$tmp/$stamp"

# Swap the finished tree into place.
if [ -e "$dest" ]; then
	mv "$dest" "$build/.pyrootfs.old.$$"
	remove_tree "$build/.pyrootfs.old.$$"
fi
mv "$tmp" "$dest"
trap - EXIT
log "built $dest: Python $py, $(du -sm "$dest" | cut -f1) MiB, $(($(date +%s) - start)) s"
