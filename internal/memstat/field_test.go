package memstat

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFieldKiB(t *testing.T) {
	path := filepath.Join(t.TempDir(), "smaps")
	content := "7f00-7f40 rw-s 0 00:01 1 /memfd:runsc-memory\nShmemPmdMapped:     2048 kB\nPss:  12 kB\n7f40-7f80 r--p 0 00:01 2 /x\nShmemPmdMapped:     4096 kB\n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, test := range []struct {
		name    string
		want    uint64
		wantErr string
	}{
		{name: "ShmemPmdMapped", want: 6144},
		{name: "Pss", want: 12},
		{name: "Rss", wantErr: "has no Rss"},
		{name: "ShmemPmd", wantErr: "has no ShmemPmd"},
	} {
		got, err := FieldKiB(path, test.name)
		if test.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), test.wantErr) {
				t.Errorf("FieldKiB(%q) = %d, %v; want an error containing %q", test.name, got, err, test.wantErr)
			}
			continue
		}
		if err != nil || got != test.want {
			t.Errorf("FieldKiB(%q) = %d, %v; want %d", test.name, got, err, test.want)
		}
	}
}
