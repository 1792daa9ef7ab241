#!/usr/bin/env bash
# containerd.sh puts containerd 1.7 under build/containerd without installing
# it (`apt-get download`, `dpkg-deb -x`). The shim needs 1.7 (1.6 cannot parse
# the runsc shim's start reply):
#   - where the host's own apt sources offer containerd 1.7 (Debian 13
#     trixie, Ubuntu 24.04 noble, Ubuntu 22.04 jammy-updates), that package;
#   - on Debian 12 bookworm (which has 1.6), trixie's package, through a
#     private source list derived from this machine's Debian mirror;
#   - CONTAINERD_DEB=/path/to/containerd_1.7*.deb uses that file.
# Anything else fails with a message naming the distribution.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest=$top/build/containerd
if [ -x "$dest/usr/bin/containerd" ]; then
	echo "containerd.sh: $("$dest/usr/bin/containerd" --version)"
	exit 0
fi
# shellcheck disable=SC1091
. /etc/os-release
distro="${PRETTY_NAME:-unknown distribution}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"

deb=${CONTAINERD_DEB:-}
if [ -z "$deb" ]; then
	# The host's own sources first.
	(cd "$work" && { apt-get download -q containerd >/dev/null 2>&1 ||
		{ apt-get update -q >/dev/null && apt-get download -q containerd >/dev/null 2>&1; }; }) || true
	deb=$(ls "$work"/containerd_1.7*.deb 2>/dev/null | head -1 || true)
fi
if [ -z "$deb" ] && [ "${ID:-}" = debian ]; then
	# Debian before trixie: trixie's package from this machine's mirror.
	mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
	if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
		mirror=$(awk '$1=="deb" && $2 !~ /^\[/ {print $2; exit} $1=="deb" && $2 ~ /^\[/ {print $3; exit}' /etc/apt/sources.list)
	fi
	if [ -n "$mirror" ]; then
		echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$work/sources.list"
		apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
			-o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -o Debug::NoLocking=1
			-o APT::Sandbox::User=root)
		rm -f "$work"/containerd_*.deb
		apt-get "${apt_opts[@]}" update -q >/dev/null
		(cd "$work" && apt-get "${apt_opts[@]}" download -q containerd >/dev/null)
		deb=$(ls "$work"/containerd_1.7*.deb 2>/dev/null | head -1 || true)
	fi
fi
if [ -z "$deb" ]; then
	offered=$(ls "$work"/containerd_*.deb 2>/dev/null | xargs -r -n1 basename || true)
	echo "containerd.sh: $distro offers no containerd 1.7 package (found: ${offered:-none}); the containerd and CRI tests need containerd 1.7: set CONTAINERD_DEB to a containerd_1.7 .deb, or use Debian 12/13 or Ubuntu 22.04/24.04" >&2
	exit 1
fi
mkdir -p "$dest.tmp"
dpkg-deb -x "$deb" "$dest.tmp"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "containerd.sh: $("$dest/usr/bin/containerd" --version) ($(basename "$deb"), on $distro)"
