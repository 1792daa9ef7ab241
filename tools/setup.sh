#!/usr/bin/env bash
# setup.sh installs what the tests and benchmarks need beyond Go, on a fresh
# machine of this kind (Debian, root): xfsprogs for loopback XFS with reflink,
# iproute2 for the network namespaces of the network clone test,
# containerd 1.7 under build/containerd (tools/containerd.sh) and Debian's
# CNI plugins under build/cni (tools/cni.sh).
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
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	apt-get install -y -q iproute2 >/dev/null
fi
# containerd 1.7 for the shim tests (under build/, not installed).
if [ "$(id -u)" = 0 ]; then
	"$(dirname "$0")/containerd.sh" || echo "setup.sh: could not fetch containerd 1.7; the containerd tests will skip" >&2
	"$(dirname "$0")/cni.sh" || echo "setup.sh: could not fetch Debian's CNI plugins; the CRI tests will skip" >&2
	"$(dirname "$0")/registry.sh" || echo "setup.sh: could not fetch Debian's docker-registry; the registry tests will skip" >&2
fi
# A Debian rootfs with python3 for the pyagent workload (build/pyrootfs, cached).
"$(dirname "$0")/pyrootfs.sh" || { [ "${CI:-}" != true ] || exit 1; echo "setup.sh: no Python rootfs; the pyagent tests will skip" >&2; }
