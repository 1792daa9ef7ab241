#!/usr/bin/env bash
# test-summary.sh filters `go test -v` output: it keeps test results, skip
# reasons, logs and failures (dropping "=== RUN" noise), and exits non-zero
# if any package failed, so that `make test` fails with go test.
set -uo pipefail
fail=0 passed=0 failed=0 skipped=0
while IFS= read -r line; do
	case "$line" in
	'=== RUN'*|'=== PAUSE'*|'=== CONT'*) ;;
	*) printf '%s\n' "$line" ;;
	esac
	case "$line" in
	'--- PASS'*) passed=$((passed+1)) ;;
	'--- FAIL'*) failed=$((failed+1)); fail=1 ;;
	'--- SKIP'*) skipped=$((skipped+1)) ;;
	FAIL*|panic:*) fail=1 ;;
	esac
done
# Top-level tests only (subtests are indented); the plain closing line.
echo "harness: $passed passed, $failed failed, $skipped skipped"
exit "$fail"
