package noreplace

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "base.writeset")
	for _, tc := range []struct {
		name        string
		data        string
		wantCreated bool
	}{
		{"into an empty place", "first", true},
		{"over an existing file", "second", false},
	} {
		if created, err := WriteFile(path, []byte(tc.data), 0o444); created != tc.wantCreated || err != nil {
			t.Fatalf("WriteFile %s = %v, %v; want %v, nil", tc.name, created, err, tc.wantCreated)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "first" || st.Mode().Perm() != 0o444 {
		t.Errorf("%s holds %q with mode %v, want \"first\" with mode 0444", path, got, st.Mode().Perm())
	}
	if _, err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("x"), 0o444); err == nil {
		t.Errorf("WriteFile into a missing directory succeeded")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("WriteFile left temporary files %v", left)
	}
}
