#!/bin/bash
# with-host-thp.sh CMD [ARG...] runs CMD from the repository's root with the
# host's transparent huge page settings that `runsc --host-settings=adjust`
# writes on a host whose shmem_enabled is "never" and defrag "madvise" (as
# on the machines of REPRODUCE.md): shmem_enabled "advise", defrag "never".
# With them runsc gives a sandbox's MemoryFile huge pages. The host's
# settings are put back when CMD exits, fails, or this script is
# interrupted or terminated (INT, TERM and HUP are passed on to CMD first);
# nothing can put them back after a SIGKILL. Needs root. It changes a
# host-wide setting: run nothing else meanwhile. Exits with CMD's status.
set -uo pipefail
if [ $# -eq 0 ]; then
	echo "usage: $0 CMD [ARG...]" >&2
	exit 2
fi
T=/sys/kernel/mm/transparent_hugepage
if [ ! -w $T/shmem_enabled ] || [ ! -w $T/defrag ]; then
	echo "with-host-thp: cannot write $T/shmem_enabled and $T/defrag (run as root on a kernel with transparent huge pages)" >&2
	exit 1
fi
selected() { sed 's/.*\[\(.*\)\].*/\1/' "$1"; }
old_shmem=$(selected $T/shmem_enabled)
old_defrag=$(selected $T/defrag)
restore() {
	echo "$old_shmem" > $T/shmem_enabled
	echo "$old_defrag" > $T/defrag
	echo "with-host-thp: shmem_enabled $(selected $T/shmem_enabled), defrag $(selected $T/defrag) (restored)" >&2
}
trap restore EXIT
echo advise > $T/shmem_enabled || exit 1
echo never > $T/defrag || exit 1
echo "with-host-thp: shmem_enabled $(selected $T/shmem_enabled), defrag $(selected $T/defrag)" >&2
cd "$(dirname "$0")/.." || exit 1
"$@" &
child=$!
for sig in INT TERM HUP; do
	trap 'kill -'$sig' $child 2>/dev/null' $sig
done
# wait returns early when a trapped signal arrives; wait again until CMD
# has exited, so that the settings are put back only after it.
status=0
while :; do
	wait $child
	status=$?
	kill -0 $child 2>/dev/null || break
done
exit $status
