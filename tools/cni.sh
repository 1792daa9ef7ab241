#!/usr/bin/env bash
# cni.sh puts Debian's CNI plugins (package containernetworking-plugins)
# under build/cni for the CRI tests' pod networking, without installing them:
# `apt-get download` and `dpkg-deb -x`. Cached.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/build/cni
if [ -x "$dest/usr/lib/cni/loopback" ]; then
	echo "cni.sh: CNI plugins at $dest/usr/lib/cni"
	exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && apt-get download -q containernetworking-plugins >/dev/null 2>&1); then
	apt-get update -q >/dev/null
	(cd "$work" && apt-get download -q containernetworking-plugins >/dev/null)
fi
deb=$(ls "$work"/containernetworking-plugins_*.deb | head -1)
mkdir -p "$dest.tmp"
dpkg-deb -x "$deb" "$dest.tmp"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "cni.sh: CNI plugins at $dest/usr/lib/cni ($(basename "$deb"))"
