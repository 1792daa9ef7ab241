package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	dir := t.TempDir()
	pool, err := warmpool.New(p.r, p.bundle, dir, "warm", 2)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			pool.Close()
		}
	}()

	var got []warmpool.Sandbox
	for i := 0; i < 3; i++ {
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
	marks := map[string]string{}
	for _, s := range got {
		p.send(t, s.ID, "mark")
		tk, _ := waitTick(t, s.Out, 0, "a mark", func(tk sandbox.Tick) bool { return tk.Mark != "" && tk.Mark != "0" })
		if other, dup := marks[tk.Mark]; dup {
			t.Fatalf("clones %s and %s print the same mark %s", other, s.ID, tk.Mark)
		}
		marks[tk.Mark] = s.ID
	}

	// A waiting sandbox killed while it waits is replaced, and the next
	// restore uses a live one.
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
	got = append(got, s)
	if err := pool.Fill(time.Minute); err != nil {
		t.Fatal(err)
	}
	if w := pool.Waiting(); slices.Contains(w, waiting[0]) || len(w) != 2 {
		t.Errorf("waiting after the kill: %v; want 2 live sandboxes, not %s", w, waiting[0])
	}

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

	// Closing the pool destroys what waits; the clones handed out stay.
	left := pool.Waiting()
	pool.Close()
	closed = true
	for _, id := range left {
		if p.r.Waiting(id) {
			t.Errorf("sandbox %s still waits after Close", id)
		}
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

// killAndReap kills process pid and waits until it is gone.
func killAndReap(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if err := p.Kill(); err != nil {
		return err
	}
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("process %d still exists 2 s after SIGKILL", pid)
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
	closed := false
	defer func() {
		if !closed {
			pool.Close()
		}
	}()

	// Restored, not running: no output, and runsc reports it paused.
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

	var got []warmpool.Sandbox
	for i := 0; i < 3; i++ {
		s, err := pool.Restore(p.image)
		if err != nil {
			t.Fatal(err)
		}
		checkFirstTick(t, s.ID, s.Out, p.lastTick)
		got = append(got, s)
		if err := pool.Fill(time.Minute); err != nil {
			t.Fatalf("refilling after resume %d: %v", i, err)
		}
	}
	marks := map[string]string{}
	for _, s := range got {
		p.send(t, s.ID, "mark")
		tk, _ := waitTick(t, s.Out, 0, "a mark", func(tk sandbox.Tick) bool { return tk.Mark != "" && tk.Mark != "0" })
		if other, dup := marks[tk.Mark]; dup {
			t.Fatalf("clones %s and %s print the same mark %s", other, s.ID, tk.Mark)
		}
		marks[tk.Mark] = s.ID
	}

	// A waiting clone killed while it waits is replaced.
	waiting = pool.Waiting()
	pid, err := p.r.SandboxPID(waiting[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := killAndReap(pid); err != nil {
		t.Fatal(err)
	}
	s, err := pool.Restore(p.image)
	if err != nil {
		t.Fatalf("resume after a waiting clone was killed: %v", err)
	}
	if s.ID == waiting[0] {
		t.Fatalf("resumed the killed clone %s", s.ID)
	}
	checkFirstTick(t, s.ID, s.Out, p.lastTick)
	got = append(got, s)

	// The pool is bound to its image: another one is refused, naming both,
	// and no waiting clone is used up.
	if err := pool.Fill(time.Minute); err != nil {
		t.Fatal(err)
	}
	before := pool.Waiting()
	other := filepath.Join(t.TempDir(), "other")
	if _, err := pool.Restore(other); err == nil || !strings.Contains(err.Error(), p.image) || !strings.Contains(err.Error(), other) {
		t.Fatalf("restoring another image from the pool: %v; want a refusal naming %s and %s", err, p.image, other)
	}
	if w := pool.Waiting(); !slices.Equal(w, before) {
		t.Errorf("waiting after the refusal: %v, want %v", w, before)
	}

	left := pool.Waiting()
	pool.Close()
	closed = true
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
