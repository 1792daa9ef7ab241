package pauselog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		want  time.Duration
		ok    bool
		err   string
	}{
		{
			name: "upstream",
			lines: []string{
				"I1202 16:44:14.380028       1 state.go:118] Sandbox save started, pausing all tasks.",
				"I1202 16:44:14.501732       1 save_restore.go:463] MemoryFile(0x1): save scanning took 75ms",
				"I1202 16:44:14.800730       1 state.go:123] Tasks resumed after save.",
			},
			want: 420702 * time.Microsecond, ok: true,
		},
		{
			name: "forkvisor",
			lines: []string{
				"I1202 16:44:33.164447       1 state.go:147] Sandbox save started, pausing all tasks.",
				"I1202 16:44:33.238082       1 state.go:153] Tasks resumed after save; the sandbox was paused for 73.628965ms.",
			},
			want: 73635 * time.Microsecond, ok: true,
		},
		{
			name: "across midnight",
			lines: []string{
				"I1231 23:59:59.900000 1 state.go:1] Sandbox save started, pausing all tasks.",
				"I0101 00:00:00.100000 1 state.go:2] Tasks resumed after save.",
			},
			want: 200 * time.Millisecond, ok: true,
		},
		{
			name:  "no save",
			lines: []string{"I1202 16:44:33.164447 1 x.go:1] Restore done"},
		},
		{
			name:  "paused, never resumed",
			lines: []string{"I1202 16:44:33.164447 1 x.go:1] Sandbox save started, pausing all tasks."},
		},
		{
			name:  "no timestamp",
			lines: []string{"Sandbox save started, pausing all tasks."},
			err:   "no glog timestamp",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "runsc.log.20261202-164433.100000.boot.txt")
			if err := os.WriteFile(path, []byte(strings.Join(tc.lines, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			got, ok, err := File(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("File = %v, %v, %v; want an error containing %q", got, ok, err, tc.err)
				}
				return
			}
			if err != nil || ok != tc.ok || got != tc.want {
				t.Fatalf("File = %v, %v, %v; want %v, %v, nil", got, ok, err, tc.want, tc.ok)
			}
		})
	}
}

func TestDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, lines ...string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Dir(dir); err == nil {
		t.Fatalf("Dir of an empty directory succeeded")
	}
	// The source sandbox's log (the save) and the clone's (no save).
	write("runsc.log.20261202-164432.100000.boot.txt",
		"I1202 16:44:33.000000 1 s.go:1] Sandbox save started, pausing all tasks.",
		"I1202 16:44:33.050000 1 s.go:2] Tasks resumed after save.")
	write("runsc.log.20261202-164434.100000.boot.txt", "I1202 16:44:35.000000 1 r.go:1] restored")
	write("runsc.log.20261202-164432.100000.checkpoint.txt", "I1202 16:44:33.000000 1 c.go:1] Sandbox save started, pausing all tasks.")
	got, err := Dir(dir)
	if err != nil || got != 50*time.Millisecond {
		t.Fatalf("Dir = %v, %v; want 50ms", got, err)
	}
}
