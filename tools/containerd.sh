#!/usr/bin/env bash
# containerd.sh puts containerd 1.7 (Debian trixie's package; bookworm's 1.6
# cannot parse the runsc shim's start reply) under build/containerd, without
# installing it: a private apt source list derived from this machine's own
# Debian sources, `apt-get download`, `dpkg-deb -x`.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/build/containerd
if [ -x "$dest/usr/bin/containerd" ]; then
	echo "containerd.sh: $("$dest/usr/bin/containerd" --version)"
	exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
# The first deb822 source whose suite is bookworm, with trixie instead.
awk '/^URIs:/{u=$2} /^Suites:/{ if ($2=="bookworm" && !done) { print "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] " u " trixie main"; done=1 } }' \
	/etc/apt/sources.list.d/*.sources > "$work/sources.list" 2>/dev/null || true
if [ ! -s "$work/sources.list" ] && [ -f /etc/apt/sources.list ]; then
	awk '$1=="deb" && $3=="bookworm" && !done { print "deb " $2 " trixie main"; done=1 }' /etc/apt/sources.list > "$work/sources.list"
fi
if [ ! -s "$work/sources.list" ]; then
	echo "containerd.sh: found no Debian bookworm source to derive a trixie source from" >&2
	exit 1
fi
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -o Debug::NoLocking=1
	-o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update -q >/dev/null
(cd "$work" && apt-get "${apt_opts[@]}" download -q containerd >/dev/null)
deb=$(ls "$work"/containerd_1.7*.deb 2>/dev/null | head -1)
if [ -z "$deb" ]; then
	echo "containerd.sh: trixie offers no containerd 1.7 package: $(ls "$work"/*.deb 2>/dev/null)" >&2
	exit 1
fi
mkdir -p "$dest.tmp"
dpkg-deb -x "$deb" "$dest.tmp"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "containerd.sh: $("$dest/usr/bin/containerd" --version)"
