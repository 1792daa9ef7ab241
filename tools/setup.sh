#!/usr/bin/env bash
# setup.sh installs what the tests and benchmarks need beyond Go, on a fresh
# machine of this kind (Debian, root): xfsprogs for loopback XFS with reflink.
set -euo pipefail
if ! command -v mkfs.xfs >/dev/null 2>&1; then
	if [ "$(id -u)" != 0 ]; then
		echo "setup.sh: not root; the filestore tests will skip (no mkfs.xfs)" >&2
		exit 0
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	apt-get install -y -q xfsprogs >/dev/null
fi
echo "setup.sh: mkfs.xfs at $(command -v mkfs.xfs)"
