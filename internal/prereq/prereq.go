// Package prereq reports a missing test prerequisite (not root, a binary not
// built, a tool not installed): outside CI the test is skipped with the
// reason; under CI (CI=true) it fails, so that CI cannot pass by skipping.
package prereq

import (
	"fmt"
	"os"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true).
func InCI() bool {
	return os.Getenv("CI") == "true"
}

// Missing skips t (or fails it under CI) because a prerequisite is missing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("missing prerequisite under CI=true: %s", why)
	}
	t.Skip(why)
}
