package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/warmpool"
)

// TestWarmPoolRestoredPrespawned: a pool of paused clones whose runsc
// resume processes wait on a pipe. Each waiting clone is paused, prints
// nothing and has one waiting resume; a request is served by that process
// (it exits, no other starts) and the clone continues the tick; a clone
// whose waiting resume was killed is not handed out but replaced; a killed
// clone is replaced; Close leaves no waiting process or clone.
func TestWarmPoolRestoredPrespawned(t *testing.T) {
	p := parkSource(t, 64)
	dir := t.TempDir()
	pool, err := warmpool.NewRestoredPrespawned(p.r, p.bundle, p.image, dir, "resumer", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	resumes := func(id string) []int { return pendingRunsc(t, id, "resume", "--wait-line-from") }
	time.Sleep(300 * time.Millisecond)
	for _, id := range pool.Waiting() {
		if !p.r.Paused(id) {
			t.Errorf("waiting clone %s is not paused", id)
		}
		if b, err := os.ReadFile(filepath.Join(dir, id+".out")); err != nil || len(b) != 0 {
			t.Errorf("waiting clone %s printed %q (%v) before it was resumed", id, b, err)
		}
		if pids := resumes(id); len(pids) != 1 {
			t.Fatalf("waiting clone %s has %d runsc resume processes waiting (%v), want 1", id, len(pids), pids)
		}
	}

	checkPrespawnedPool(t, p, pool, "resume", resumes)
}

// TestPendingResumeRefusals: `runsc resume --wait-line-from` resumes only on
// a line holding the container's full ID. A line naming another container,
// end of file (a cancel) and a process killed before the line leave the
// clone paused and silent, each with its error; the clone then resumes
// through a pending resume sent its ID and continues the tick; a pending
// resume of the running container is refused before it waits for a line.
func TestPendingResumeRefusals(t *testing.T) {
	p := parkSource(t, 32)
	out := filepath.Join(p.dir, "c.out")
	if err := p.r.Restore(p.bundle, "c", p.image, out, "--paused"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.r.Destroy("c") })

	stillPaused := func(after string) {
		t.Helper()
		time.Sleep(200 * time.Millisecond)
		if !p.r.Paused("c") {
			t.Fatalf("container c is not paused after %s", after)
		}
		if b, err := os.ReadFile(out); err != nil || len(b) != 0 {
			t.Fatalf("container c printed %q (%v) after %s", b, err, after)
		}
	}
	start := func() *sandbox.PendingResume {
		t.Helper()
		pending, err := p.r.StartResume("c", out) // returns once it reads
		if err != nil {
			t.Fatal(err)
		}
		return pending
	}

	// A line naming another container: runsc resume run with that line as
	// its standard input.
	cmd := p.r.Command("resume", "--wait-line-from=/dev/stdin", "c")
	cmd.Stdin = strings.NewReader("c2\n")
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), `the line "c2" does not name container "c"`) {
		t.Fatalf("runsc resume --wait-line-from given another container's ID: %v: %s; want a refusal", err, b)
	}
	stillPaused("a line naming another container")

	// End of file before a line: the caller cancelled.
	if err := start().Cancel(); err == nil || !strings.Contains(err.Error(), "end of file before a complete line (0 bytes)") {
		t.Fatalf("cancelled pending resume: %v; want an error saying the pipe ended without a line", err)
	}
	stillPaused("a cancelled pending resume")

	// The process killed before the line.
	pending := start()
	if err := killAndReap(pending.Pid()); err != nil {
		t.Fatal(err)
	}
	if pending.Waiting() {
		t.Errorf("the pending resume still reports waiting after its process was killed")
	}
	if err := pending.Resume(); !errors.Is(err, sandbox.ErrResumeNotStarted) {
		t.Fatalf("resume through a killed pending resume: %v; want %v", err, sandbox.ErrResumeNotStarted)
	}
	stillPaused("a killed pending resume")

	pending = start()
	if err := pending.Resume(); err != nil {
		t.Fatalf("resume with the container's ID: %v", err)
	}
	checkFirstTick(t, "c", out, p.lastTick)
	// A running container is refused before the wait: StartResume sees the
	// process exit instead of reading its line.
	if _, err := p.r.StartResume("c", out); err == nil || !strings.Contains(err.Error(), `container "c" is running, not paused`) {
		t.Fatalf("pending resume of a running container: %v; want a refusal", err)
	}
}
