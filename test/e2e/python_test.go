package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/prereq"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestSharedBasePythonClones parks a CPython asyncio agent (a dict of small
// dicts, iterated every tick: reference counts write all over the heap) with
// --shared-base and restores 3 clones from it: each continues the tick
// counter with its state intact, the first learns the base's write set and
// the others apply it, and marks written after restore stay private.
func TestSharedBasePythonClones(t *testing.T) {
	bin := binary(t, "runsc")
	if _, err := sandbox.PyRootfs(repoRoot); err != nil {
		prereq.Missing(t, "%v", err)
	}
	r, dir := newRoot(t, bin)
	bundle := filepath.Join(dir, "bundle")
	if err := sandbox.NewPyAgentBundle(bundle, repoRoot, 50000, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	src := &source{r: r, dir: dir, bundle: bundle, out: filepath.Join(dir, "source.out")}
	if err := r.Run(bundle, "source", src.out); err != nil {
		t.Fatal(err)
	}
	waitTick(t, src.out, 0, "the agent's third tick", func(tk sandbox.Tick) bool { return tk.N >= 3 })
	p := src.park(t, filepath.Join(dir, "image"), "--shared-base")
	image, last := p.image, p.lastTick
	marks := map[string]bool{}
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("py%d", i)
		out := p.restoreClone(t, id, image, last)
		if i == 0 {
			waitWriteSet(t, r.WriteSetPath(image))
		}
		if _, err := r.Exec(append([]string{"exec", id}, sandbox.PyAgentSend("mark")...)...); err != nil {
			t.Fatal(err)
		}
		tk, _ := waitTick(t, out, 0, "a mark", func(tk sandbox.Tick) bool { return tk.Mark != "" && tk.Mark != "0" })
		if marks[tk.Mark] {
			t.Fatalf("clone %s prints a mark another clone wrote: %s", id, tk.Mark)
		}
		marks[tk.Mark] = true
		// A few more passes over the whole state, still intact.
		waitTick(t, out, 0, "three more ticks", func(t2 sandbox.Tick) bool { return t2.N >= tk.N+3 && t2.Mark == tk.Mark })
	}
}
