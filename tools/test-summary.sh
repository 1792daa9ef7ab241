#!/usr/bin/env bash
# test-summary.sh filters `go test -v` output: it keeps test results, skip
# reasons, logs and failures (dropping "=== RUN" noise), and exits non-zero
# if any package failed, so that `make test` fails with go test.
set -uo pipefail
fail=0
while IFS= read -r line; do
	case "$line" in
	'=== RUN'*|'=== PAUSE'*|'=== CONT'*) ;;
	*) printf '%s\n' "$line" ;;
	esac
	case "$line" in
	FAIL*|'--- FAIL'*|panic:*) fail=1 ;;
	esac
done
exit "$fail"
