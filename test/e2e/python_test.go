package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/memstat"
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

// TestSharedBaseBulkCopySparesForkRelatives parks a CPython agent whose state
// its child, forked before the park (the agent's "hold" command), shares
// copy-on-write, and restores the pair over the base: two address spaces
// that map the same base pages. The child then reads, and so writes, the
// first 65% of the entries: more than half of its base by whole-window
// copies, so its address space copies the rest of its base pages in bulk
// (mm's copyRemainingBaseLocked), except pages that another address space
// maps too. The parent maps the whole state, so the bulk copy must spare
// the part the child did not write, as upstream keeps one copy between
// parent and child until one of them writes: the clone's MemoryFile must end
// well below the base's size (a copy of the whole state fails). Then the
// child checks the whole state, exits, and the parent checks the whole
// state too.
func TestSharedBaseBulkCopySparesForkRelatives(t *testing.T) {
	const entries, pct, bound = 200000, 65, 0.8
	bin := binary(t, "runsc")
	if _, err := sandbox.PyRootfs(repoRoot); err != nil {
		prereq.Missing(t, "%v", err)
	}
	r, dir := newRoot(t, bin)
	bundle := filepath.Join(dir, "bundle")
	if err := sandbox.NewPyAgentBundle(bundle, repoRoot, entries, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	src := &source{r: r, dir: dir, bundle: bundle, out: filepath.Join(dir, "source.out")}
	if err := r.Run(bundle, "source", src.out); err != nil {
		t.Fatal(err)
	}
	waitTick(t, src.out, 0, "the agent's first tick", func(tk sandbox.Tick) bool { return tk.N >= 1 })
	if _, err := r.Exec(append([]string{"exec", "source"}, sandbox.PyAgentSend("hold")...)...); err != nil {
		t.Fatal(err)
	}
	_, from := waitLine(t, src.out, 0, "holder ready")
	waitTick(t, src.out, from, "a tick of the holding parent", func(sandbox.Tick) bool { return true })
	p := src.park(t, filepath.Join(dir, "image"), "--shared-base")
	baseMiB := allocatedMiB(t, filepath.Join(p.image, "base.img"))

	// The first clone learns the base's write set: the parent's light
	// passes, nothing of the child's. The pair under test is the second.
	p.restoreClone(t, "learner", p.image, p.lastTick)
	waitWriteSet(t, r.WriteSetPath(p.image))
	r.Destroy("learner")
	logs := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	r.LogDir = logs
	out := p.restoreClone(t, "pair", p.image, p.lastTick)
	sendHolder := func(cmd string) {
		t.Helper()
		if _, err := r.Exec(append([]string{"exec", "pair"}, sandbox.PyAgentSend(cmd, "--ctl", sandbox.PyAgentHolderCtl)...)...); err != nil {
			t.Fatal(err)
		}
	}
	sendHolder(fmt.Sprintf("pass %d", pct))
	_, from = waitLine(t, out, 0, fmt.Sprintf("holder pass=%d ", pct))

	// Both messages of a bulk copy contain this; one that spared pages says so.
	spared := false
	for _, l := range logLines(t, logs, "of the remaining shared base memory") {
		t.Log(l)
		spared = spared || strings.Contains(l, "spared pages other address spaces map: true") || strings.Contains(l, "Copied none of the remaining")
	}
	if !spared {
		t.Errorf("the child's dense writes should have led to a bulk copy that spares what its parent maps (debug logs in %s)", logs)
	}
	m, err := r.Memory("pair")
	if err != nil {
		t.Fatal(err)
	}
	guest := float64(m.ByKind[memstat.KindGuest]) / 1024
	t.Logf("the child read (and so wrote) the first %d%% of the entries: the clone's MemoryFile holds %.1f MiB, the base %.1f MiB (bound %.0f%% of it)", pct, guest, baseMiB, bound*100)
	if guest > bound*baseMiB {
		t.Errorf("the clone's MemoryFile holds %.1f MiB after its child wrote the first %d%% of the entries, above %.0f%% of the %.1f MiB base: the bulk copy copied pages that the parent still shares", guest, pct, bound*100, baseMiB)
	}

	sendHolder("check")
	if line, _ := waitLine(t, out, from, "holder sum="); !strings.HasPrefix(line, "holder sum=ok ") {
		t.Errorf("the child's check of the whole state after the bulk copy: %q, want sum=ok", line)
	}
	sendHolder("exit")
	_, from = waitLine(t, out, from, "holder exited status=0")
	// The parent's ticks read every entry again once the child is gone.
	waitTick(t, out, from, "a full pass of the parent", func(sandbox.Tick) bool { return true })
}

// allocatedMiB returns the MiB allocated to the file at path (a sparse
// base.img: its non-zero pages).
func allocatedMiB(t *testing.T, path string) float64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return float64(st.Blocks) * 512 / (1 << 20)
}
