package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestCheckpointRestoreWithoutBase checks that plain checkpoint/restore (no
// shared base) behaves the same with the fork as with upstream: the restored
// workload continues its tick counter exactly where it stopped, with its
// memory intact.
func TestCheckpointRestoreWithoutBase(t *testing.T) {
	for _, name := range []string{"runsc-upstream", "runsc"} {
		t.Run(name, func(t *testing.T) {
			src := startSource(t, name, 32)
			r, dir, bundle, srcOut := src.r, src.dir, src.bundle, src.out

			image := filepath.Join(dir, "image")
			if err := r.Checkpoint("source", image); err != nil {
				t.Fatal(err)
			}
			r.Destroy("source")
			lines := sandbox.Lines(srcOut)
			last, err := sandbox.ParseTick(lines[len(lines)-1])
			if err != nil {
				t.Fatal(err)
			}
			if st, err := os.Stat(filepath.Join(image, "pages.img")); err != nil || st.Size() < 32<<20 {
				t.Fatalf("pages.img: %v (size %d), want at least the 32 MiB heap", err, st.Size())
			}

			cloneOut := filepath.Join(dir, "clone.out")
			if err := r.Restore(bundle, "clone", image, cloneOut); err != nil {
				t.Fatal(err)
			}
			line, _, err := sandbox.WaitForLine(cloneOut, 0, 30*time.Second, sandbox.IsTick)
			if err != nil {
				t.Fatal(err)
			}
			first, _ := sandbox.ParseTick(line)
			if first.N != last.N+1 {
				t.Errorf("restored workload printed tick %d first; the source's last tick was %d", first.N, last.N)
			}
			// Let the checksum walk the whole heap (32 MiB at 4 MiB per tick).
			line, _, err = sandbox.WaitForLine(cloneOut, 0, 30*time.Second, func(l string) bool {
				tk, err := sandbox.ParseTick(l)
				return err == nil && (tk.N >= first.N+10 || !tk.OK)
			})
			if err != nil {
				t.Fatal(err)
			}
			if tk, _ := sandbox.ParseTick(line); !tk.OK {
				t.Errorf("restored workload's heap is corrupt: %s", line)
			}
		})
	}
}
