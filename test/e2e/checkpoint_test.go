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
			p := src.park(t, filepath.Join(src.dir, "image"))
			if st, err := os.Stat(filepath.Join(p.image, "pages.img")); err != nil || st.Size() < 32<<20 {
				t.Fatalf("pages.img: %v (size %d), want at least the 32 MiB heap", err, st.Size())
			}
			out := p.restoreClone(t, "clone", p.image, p.lastTick)
			// Let the checksum walk the whole heap (32 MiB at 4 MiB per tick).
			waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= p.lastTick+1+32/4+2 })
		})
	}
}
