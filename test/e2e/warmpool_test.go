package e2e

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/warmpool"
)

// TestWarmPoolRestore restores clones into sandboxes that were started
// before the image was chosen (internal/warmpool: runsc create, then runsc
// restore of the created container): each clone continues the tick with its
// heap intact and keeps a private mark; the pool refills; a waiting sandbox
// that was killed is replaced; an image of another spec is refused naming
// the difference; nothing is left once the pool is closed.
func TestWarmPoolRestore(t *testing.T) {
	p := parkSource(t, 64)
	pool, err := warmpool.New(p.r, p.bundle, t.TempDir(), "warm", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	got := restoreFromPool(t, p, pool, 3)
	checkPrivateMarks(t, p, got)
	got = append(got, restoreAfterKill(t, p, pool))

	// An image saved from another spec is refused, and the sandbox it was
	// given is replaced.
	other := startSource(t, "runsc", 32)
	otherImage := filepath.Join(other.dir, "image")
	other.park(t, otherImage, "--shared-base")
	before := pool.Waiting()
	if _, err := pool.Restore(otherImage); err == nil || !strings.Contains(err.Error(), `"Args" does not match`) {
		t.Fatalf("restoring an image of another spec: %v; want runsc's refusal naming Args", err)
	}
	if err := pool.Fill(time.Minute); err != nil {
		t.Fatal(err)
	}
	if w := pool.Waiting(); len(w) != 2 || w[0] == before[0] {
		t.Errorf("waiting after the refused restore: %v (before %v); want the used one replaced", w, before)
	}

	checkPoolClose(t, p, pool, got)
}

// TestWarmPoolRestoredClones keeps clones of one image restored with
// `runsc restore --paused` (warmpool.NewRestored): a waiting clone prints
// nothing and reports itself paused; Restore resumes it, and it continues
// the tick with its heap intact and a private mark; the pool refills; a
// killed waiting clone is replaced; another image is refused naming both;
// Close leaves nothing behind.
func TestWarmPoolRestoredClones(t *testing.T) {
	p := parkSource(t, 64)
	dir := t.TempDir()
	pool, err := warmpool.NewRestored(p.r, p.bundle, p.image, dir, "paused", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// Restored, not running: no output, and runsc reports it paused. (A
	// clone that ran would print its first tick within 50 ms.)
	waiting := pool.Waiting()
	if len(waiting) != 2 {
		t.Fatalf("%d clones waiting, want 2", len(waiting))
	}
	time.Sleep(500 * time.Millisecond)
	for _, id := range waiting {
		if !p.r.Paused(id) {
			t.Errorf("waiting clone %s is not paused", id)
		}
		if b, err := os.ReadFile(filepath.Join(dir, id+".out")); err != nil || len(b) != 0 {
			t.Errorf("waiting clone %s printed %q (%v) before it was resumed", id, b, err)
		}
	}

	got := restoreFromPool(t, p, pool, 3)
	checkPrivateMarks(t, p, got)
	got = append(got, restoreAfterKill(t, p, pool))

	// The pool is bound to its image: another one is refused, naming both,
	// and no waiting clone is used up.
	before := pool.Waiting()
	other := filepath.Join(t.TempDir(), "other")
	if _, err := pool.Restore(other); !errors.Is(err, warmpool.ErrOtherImage) || !strings.Contains(err.Error(), p.image) || !strings.Contains(err.Error(), other) {
		t.Fatalf("restoring another image from the pool: %v; want a refusal naming %s and %s", err, p.image, other)
	}
	if w := pool.Waiting(); !slices.Equal(w, before) {
		t.Errorf("waiting after the refusal: %v, want %v", w, before)
	}

	checkPoolClose(t, p, pool, got)
}

// restoreFromPool restores n clones of p's image from pool, checking that
// each continues the tick and that the pool refills after each.
func restoreFromPool(t *testing.T, p *parked, pool *warmpool.Pool, n int) []warmpool.Sandbox {
	t.Helper()
	var got []warmpool.Sandbox
	for i := 0; i < n; i++ {
		s, err := pool.Restore(p.image)
		if err != nil {
			t.Fatal(err)
		}
		checkFirstTick(t, s.ID, s.Out, p.lastTick)
		got = append(got, s)
		if err := pool.Fill(time.Minute); err != nil {
			t.Fatalf("refilling after restore %d: %v", i, err)
		}
	}
	return got
}

// checkPrivateMarks has every clone store a random mark and checks that no
// two clones print the same one.
func checkPrivateMarks(t *testing.T, p *parked, clones []warmpool.Sandbox) {
	t.Helper()
	marks := map[string]string{}
	for _, s := range clones {
		p.send(t, s.ID, "mark")
		tk, _ := waitTick(t, s.Out, 0, "a mark", func(tk sandbox.Tick) bool { return tk.Mark != "" && tk.Mark != "0" })
		if other, dup := marks[tk.Mark]; dup {
			t.Fatalf("clones %s and %s print the same mark %s", other, s.ID, tk.Mark)
		}
		marks[tk.Mark] = s.ID
	}
}

// restoreAfterKill kills the sandbox of the oldest of pool's 2 waiting
// sandboxes, restores a clone (which must come from a live one and continue
// the tick), and checks that the pool refills to 2 live sandboxes without
// the killed one.
func restoreAfterKill(t *testing.T, p *parked, pool *warmpool.Pool) warmpool.Sandbox {
	t.Helper()
	waiting := pool.Waiting()
	if len(waiting) != 2 {
		t.Fatalf("%d sandboxes waiting, want 2", len(waiting))
	}
	pid, err := p.r.SandboxPID(waiting[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := killAndReap(pid); err != nil {
		t.Fatal(err)
	}
	s, err := pool.Restore(p.image)
	if err != nil {
		t.Fatalf("restore after a waiting sandbox was killed: %v", err)
	}
	if s.ID == waiting[0] {
		t.Fatalf("restored into the killed sandbox %s", s.ID)
	}
	checkFirstTick(t, s.ID, s.Out, p.lastTick)
	if err := pool.Fill(time.Minute); err != nil {
		t.Fatal(err)
	}
	if w := pool.Waiting(); slices.Contains(w, waiting[0]) || len(w) != 2 {
		t.Errorf("waiting after the kill: %v; want 2 live sandboxes, not %s", w, waiting[0])
	}
	return s
}

// checkPoolClose closes pool and checks that what waited is gone and that
// the clones handed out (got) remain.
func checkPoolClose(t *testing.T, p *parked, pool *warmpool.Pool, got []warmpool.Sandbox) {
	t.Helper()
	left := pool.Waiting()
	pool.Close()
	for _, id := range left {
		if _, err := p.r.Exec("state", id); err == nil {
			t.Errorf("container %s still exists after Close", id)
		}
	}
	for _, s := range got {
		if _, err := p.r.Exec("state", s.ID); err != nil {
			t.Errorf("clone %s handed out before Close: %v", s.ID, err)
		}
	}
}

// killAndReap kills process pid and waits until it is gone (its parent,
// a goroutine of the harness for the runsc processes it starts, has reaped
// it).
func killAndReap(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if err := p.Kill(); err != nil {
		return err
	}
	if err := processGone(pid, reapTimeout); err != nil {
		return fmt.Errorf("after SIGKILL: %w", err)
	}
	return nil
}

// reapTimeout is how long a process may take to be gone after it was
// killed or told to exit. A loaded CI machine (2 CPUs, a dozen sandboxes of
// other tests) has delayed that by more than 2 s.
const reapTimeout = 10 * time.Second

// processGone waits up to timeout for process pid to be gone: no process
// with that PID, or one started later (the PID was reused). If it is not,
// the error says what the process was doing (its state and parent).
func processGone(pid int, timeout time.Duration) error {
	// gone reports whether the read says there is no such process; any
	// other error is one to report, not a process gone.
	gone := func(err error) bool {
		return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
	}
	first, err := sandbox.ReadProcStat(pid)
	if gone(err) {
		return nil
	}
	if err != nil {
		return err
	}
	// same reports whether pid is still the process first read, or the
	// error of a read that failed otherwise than by its absence.
	same := func() (sandbox.ProcStat, bool, error) {
		st, err := sandbox.ReadProcStat(pid)
		if gone(err) {
			return st, false, nil
		}
		return st, err == nil && st.StartTicks == first.StartTicks, err
	}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, ok, err := same(); err != nil || !ok {
			return err
		}
	}
	st, ok, err := same()
	if err != nil || !ok {
		return err
	}
	return fmt.Errorf("process %d still exists after %v: state %c, parent %d (Z: killed, not yet reaped by its parent)", pid, timeout, st.State, st.PPID)
}
