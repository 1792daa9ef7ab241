#!/usr/bin/env bash
# Fails if a package of the tree holds a *_test.go file but is not among the
# packages that make test-fork runs (the arguments): upstream's module ships
# no tests, so every test in the tree is the fork's, and one that make test
# does not run cannot catch anything.
set -euo pipefail
tree=$1
shift
listed=" $* "
missing=0
while read -r dir; do
	if [[ $listed != *" $dir/ "* ]]; then
		echo "check-test-pkgs: $dir holds tests but is not in FORK_TEST_PKGS (Makefile)" >&2
		missing=1
	fi
done < <(cd "$tree" && find . -name '*_test.go' -printf '%h\n' | sort -u)
exit $missing
