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
// on a filesystem too small for it (plain, --shared-base, and --shared-base
// --leave-running): the checkpoint fails with an error that names the
// directory and the lack of space; the source keeps running with its heap
// intact (upstream kills it unless --leave-running); the directory the
// checkpoint created is removed and the base store holds nothing new; and
// the source can then be parked elsewhere and restored.
func TestCheckpointOutOfSpace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"shared base", []string{"--shared-base"}},
		{"shared base, leave running", []string{"--shared-base", "--leave-running"}},
		{"plain", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := startSource(t, "runsc", 64)
			image := filepath.Join(smallFS(t, "16m"), "image")
			err := src.r.Checkpoint("source", image, tc.flags...)
			if err == nil {
				t.Fatalf("checkpoint into a 16 MiB filesystem succeeded")
			}
			t.Logf("checkpoint: %v", err)
			msg := err.Error()
			if !strings.Contains(msg, "no space left on device") || !strings.Contains(msg, image) {
				t.Errorf("checkpoint error %q; want it to name %s and the lack of space", msg, image)
			}
			// The source keeps running with its heap intact.
			n := len(sandbox.Lines(src.out))
			if _, _, err := sandbox.WaitTick(src.out, n, 10*time.Second, func(sandbox.Tick) bool { return true }); err != nil {
				t.Fatalf("source after the failed checkpoint: %v", err)
			}
			// The directory that the checkpoint created is gone, so is
			// anything it would have put into the base store, and nothing
			// restores.
			if entries, err := os.ReadDir(image); !os.IsNotExist(err) {
				t.Errorf("the failed checkpoint left %s (%v, %d entries)", image, err, len(entries))
			}
			if entries, _ := os.ReadDir(filepath.Join(src.r.StorePath(), "sha256")); len(entries) != 0 {
				t.Errorf("the failed checkpoint left %d entries in the base store", len(entries))
			}
			if err := src.r.Restore(src.bundle, "from-failed", image, filepath.Join(src.dir, "ff.out")); err == nil {
				t.Errorf("restore from the failed checkpoint's directory succeeded")
			}
			// The source can still be parked where there is room.
			p := src.park(t, filepath.Join(src.dir, "image"), tc.flags...)
			if !slices.Contains(tc.flags, "--leave-running") {
				p.restoreClone(t, "after-enospc", p.image, p.lastTick)
			}
		})
	}
}
