#!/usr/bin/env bash
# registry.sh puts Debian's OCI registry (package docker-registry, the CNCF
# distribution registry 2.8) under build/registry, without installing it or
# starting it: `apt-get download` from this machine's own Debian sources and
# `dpkg-deb -x`. Tests start it themselves on loopback (internal/ociregistry).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/build/registry
bin=$dest/usr/bin/docker-registry
if [ -x "$bin" ]; then
	echo "registry.sh: $("$bin" --version)"
	exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q docker-registry >/dev/null 2>"$work/err") || {
	# The package lists may be stale on a fresh machine.
	apt-get update -q >/dev/null
	(cd "$work" && apt-get download -q docker-registry >/dev/null)
}
deb=$(ls "$work"/docker-registry_*.deb 2>/dev/null | head -1)
if [ -z "$deb" ]; then
	echo "registry.sh: no docker-registry package was downloaded" >&2
	exit 1
fi
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
dpkg-deb -x "$deb" "$dest.tmp"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "registry.sh: $("$bin" --version)"
