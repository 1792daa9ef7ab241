package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// smallFS mounts a tmpfs of size bytes at a new directory and returns it.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mounting a %s tmpfs: %v", size, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestCheckpointOutOfSpace parks a 64 MiB workload into an image directory
// on a filesystem too small for it: the checkpoint fails with an error that
// names the directory and the lack of space; the failed save leaves no
// checkpoint file (a directory the checkpoint created is removed, files that
// were there stay) and nothing new in the base store, and nothing restores
// from it. With --leave-running the source keeps running with its heap
// intact and can then be parked elsewhere and restored; without it, the
// sandbox exits as upstream's does after a failed save.
func TestCheckpointOutOfSpace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		// existing puts the image directory, holding another file, in
		// place before the checkpoint.
		existing bool
	}{
		{name: "shared base", flags: []string{"--shared-base"}},
		{name: "shared base, leave running", flags: []string{"--shared-base", "--leave-running"}},
		{name: "plain, into a directory that exists", existing: true},
		{name: "plain, leave running", flags: []string{"--leave-running"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := startSource(t, "runsc", 64)
			image := filepath.Join(smallFS(t, "16m"), "image")
			other := filepath.Join(image, "notes.txt")
			if tc.existing {
				if err := os.Mkdir(image, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(other, []byte("not the checkpoint's"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := src.r.Checkpoint("source", image, tc.flags...)
			if err == nil {
				t.Fatalf("checkpoint into a 16 MiB filesystem succeeded")
			}
			t.Logf("checkpoint: %v", err)
			if msg := err.Error(); !strings.Contains(msg, "no space left on device") || !strings.Contains(msg, image) {
				t.Errorf("checkpoint error %q; want it to name %s and the lack of space", msg, image)
			}
			entries, err := os.ReadDir(image)
			switch {
			case tc.existing:
				if len(entries) != 1 || entries[0].Name() != "notes.txt" {
					t.Errorf("the image directory holds %v after the failed checkpoint (%v); want only the file that was there", entries, err)
				}
			case !os.IsNotExist(err):
				t.Errorf("the failed checkpoint left %s (%v, %d entries)", image, err, len(entries))
			}
			if entries, _ := os.ReadDir(filepath.Join(src.r.StorePath(), "sha256")); len(entries) != 0 {
				t.Errorf("the failed checkpoint left %d entries in the base store", len(entries))
			}
			if err := src.r.Restore(src.bundle, "from-failed", image, filepath.Join(src.dir, "ff.out")); err == nil {
				t.Errorf("restore from the failed checkpoint's directory succeeded")
			}
			if !slices.Contains(tc.flags, "--leave-running") {
				return
			}
			// The source keeps running with its heap intact, and can be
			// parked where there is room.
			n := len(sandbox.Lines(src.out))
			if _, _, err := sandbox.WaitTick(src.out, n, 10*time.Second, func(sandbox.Tick) bool { return true }); err != nil {
				t.Fatalf("source after the failed checkpoint: %v", err)
			}
			p := src.park(t, filepath.Join(src.dir, "image"), tc.flags...)
			if _, _, err := p.r.RestoreFirstTick(p.bundle, "after-enospc", p.image, filepath.Join(src.dir, "after.out")); err != nil {
				t.Fatal(err)
			}
		})
	}
}
