package e2e

import (
	"os"
	"path/filepath"
	"testing"

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
			last := lastTick(t, srcOut)
			if st, err := os.Stat(filepath.Join(image, "pages.img")); err != nil || st.Size() < 32<<20 {
				t.Fatalf("pages.img: %v (size %d), want at least the 32 MiB heap", err, st.Size())
			}

			p := &parked{r: r, dir: dir, bundle: bundle, image: image, lastTick: last.N}
			out := p.restoreClone(t, "clone", image, last.N)
			// Let the checksum walk the whole heap (32 MiB at 4 MiB per tick).
			waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= last.N+1+32/4+2 })
		})
	}
}
