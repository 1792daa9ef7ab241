package e2e

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/warmpool"
)

// TestWarmPoolPrespawned restores clones into sandboxes created beforehand
// whose `runsc restore --image-path-from` was started beforehand too
// (warmpool.NewPrespawned): each waiting sandbox has one such runsc process;
// each clone continues the tick with its heap intact and keeps a private
// mark; the pool refills; a waiting sandbox whose restore process or whose
// sandbox was killed is replaced; Close leaves no sandbox and no runsc
// process waiting.
func TestWarmPoolPrespawned(t *testing.T) {
	p := parkSource(t, 64)
	pool, err := warmpool.NewPrespawned(p.r, p.bundle, t.TempDir(), "spawned", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, id := range pool.Waiting() {
		if pids := pendingRestores(t, id); len(pids) != 1 {
			t.Fatalf("waiting sandbox %s has %d runsc restore processes waiting for an image (%v), want 1", id, len(pids), pids)
		}
	}
	if _, err := pool.Restore(p.image, "--background"); err == nil || !strings.Contains(err.Error(), "takes its flags when it is made") {
		t.Fatalf("restore with flags from a prespawned pool: %v; want a refusal", err)
	}

	checkPrespawnedPool(t, p, pool, "restore", func(id string) []int { return pendingRestores(t, id) })
}

// TestPendingRestoreCancelled starts a `runsc restore --image-path-from` of a
// created container and closes its pipe without an image path: runsc fails
// with an error naming the file, and the container still waits, so that a
// later restore of it works. A container removed while its restore waits is
// not replaced by another one whose ID it prefixes (runsc otherwise matches
// IDs by unique prefix), nor by a new sandbox: the restore fails saying so;
// nor does a restore that started without its container go into one created
// during the wait.
func TestPendingRestoreCancelled(t *testing.T) {
	p, out, pending := createPending(t)
	err := pending.Cancel()
	if err == nil || !strings.Contains(err.Error(), "--image-path-from=/dev/stdin: end of file before a complete line") {
		t.Fatalf("runsc restore whose pipe closed without an image path: %v; want an error naming the file", err)
	}
	if !p.r.Waiting("c") {
		t.Fatalf("container c no longer waits after the cancelled restore")
	}
	// Both flags at once are refused before anything waits.
	if _, err := p.r.Exec("restore", "--image-path", p.image, "--image-path-from=/dev/null", "--bundle", p.bundle, "--detach", "c"); err == nil || !strings.Contains(err.Error(), "--image-path and --image-path-from are exclusive") {
		t.Fatalf("restore with both --image-path and --image-path-from: %v; want a refusal", err)
	}
	pending, err = p.r.StartRestore(p.bundle, "c", out)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pending.Restore(p.image); err != nil {
		t.Fatal(err)
	}
	checkFirstTick(t, "c", out, p.lastTick)
	t.Logf("restore of c after its image path was sent: %v to the first tick", time.Since(start))

	// "d" is removed while its restore waits, and "d-other", which "d"
	// matches as a unique prefix once "d" is gone, is created. (While both
	// exist, runsc refuses "d" as ambiguous.)
	if err := p.r.Create(p.bundle, "d", filepath.Join(p.dir, "d.out")); err != nil {
		t.Fatal(err)
	}
	pending, err = p.r.StartRestore(p.bundle, "d", filepath.Join(p.dir, "d.out"))
	if err != nil {
		t.Fatal(err)
	}
	// Let runsc load "d" before it is removed.
	if err := pending.WaitReading(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	p.r.Destroy("d")
	if err := p.r.Create(p.bundle, "d-other", filepath.Join(p.dir, "d-other.out")); err != nil {
		t.Fatal(err)
	}
	defer p.r.Destroy("d-other")
	if err := pending.Restore(p.image); err == nil || !strings.Contains(err.Error(), `container "d" was removed while the restore waited for its image path`) {
		t.Fatalf("restore of a container removed during the wait: %v; want a refusal saying so", err)
	}
	if !p.r.Waiting("d-other") {
		t.Errorf("d-other no longer waits: the restore of the removed d went into it")
	}
	// Not `runsc state d`: "d" matches "d-other" by prefix. Neither its
	// state file nor its lock file is back.
	if m, _ := filepath.Glob(filepath.Join(p.r.Root, "d_sandbox:d.*")); len(m) != 0 {
		t.Errorf("files of a container d exist again after the refused restore: %v", m)
	}

	// "e" does not exist when its restore starts (the restore would create
	// its own sandbox), and someone creates it meanwhile: the restore does
	// not go into that container, whose spec its checks never saw.
	pending, err = p.r.StartRestore(p.bundle, "e", filepath.Join(p.dir, "e.out"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pending.WaitReading(30 * time.Second); err != nil { // it found no "e"
		t.Fatal(err)
	}
	if err := p.r.Create(p.bundle, "e", filepath.Join(p.dir, "e-created.out")); err != nil {
		t.Fatal(err)
	}
	defer p.r.Destroy("e")
	if err := pending.Restore(p.image); err == nil || !strings.Contains(err.Error(), `matched no container when the restore started, and matches "e" now, created while the restore waited`) {
		t.Fatalf("restore into a container created during the wait: %v; want a refusal saying so", err)
	}
	if !p.r.Waiting("e") {
		t.Errorf("e no longer waits: the restore went into the container created during its wait")
	}
}

// TestPendingRestoreNotStarted kills a `runsc restore --image-path-from`
// before it reads its image path: PendingRestore stops reporting it waiting,
// Restore fails with sandbox.ErrRestoreNotStarted, the container still waits,
// and a plain restore into it works (what warmpool.Pool.Restore then does).
func TestPendingRestoreNotStarted(t *testing.T) {
	p, out, pending := createPending(t)
	if !pending.Waiting() {
		t.Fatalf("the pending restore does not wait")
	}
	if err := killAndReap(pending.Pid()); err != nil {
		t.Fatal(err)
	}
	if pending.Waiting() {
		t.Errorf("the pending restore still reports waiting after its process was killed")
	}
	if err := pending.Restore(p.image); !errors.Is(err, sandbox.ErrRestoreNotStarted) {
		t.Fatalf("restore through a killed pending restore: %v; want %v", err, sandbox.ErrRestoreNotStarted)
	}
	if !p.r.Waiting("c") {
		t.Fatalf("container c no longer waits")
	}
	if err := p.r.Restore(p.bundle, "c", p.image, out); err != nil {
		t.Fatal(err)
	}
	checkFirstTick(t, "c", out, p.lastTick)
}

// pendingRestores returns the PIDs of runsc processes that restore container
// id with --image-path-from.
func pendingRestores(t *testing.T, id string) []int {
	t.Helper()
	return pendingRunsc(t, id, "restore", "--image-path-from")
}

// pendingRunsc returns the PIDs of runsc processes of subcommand sub for
// container id whose arguments include one that begins with flag.
func pendingRunsc(t *testing.T, id, sub, flag string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if len(args) > 2 && args[len(args)-1] == id && slices.Contains(args, sub) && hasPrefixArg(args, flag) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func hasPrefixArg(args []string, prefix string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, prefix) })
}

// createPending parks a 32 MiB tick source, creates container "c" of its
// bundle (destroyed at the end of the test) and starts a pending restore
// of it; it returns the park, c's output file and the pending restore.
func createPending(t *testing.T) (*parked, string, *sandbox.PendingRestore) {
	t.Helper()
	p := parkSource(t, 32)
	out := filepath.Join(p.dir, "c.out")
	if err := p.r.Create(p.bundle, "c", out); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.r.Destroy("c") })
	pending, err := p.r.StartRestore(p.bundle, "c", out)
	if err != nil {
		t.Fatal(err)
	}
	return p, out, pending
}

// checkPrespawnedPool checks a pool whose waiting sandboxes each have a
// prespawned runsc process (kind: restore or resume; pids finds those of a
// sandbox): the oldest is handed out first and served by its process, which
// then exits, and no other starts; the clones continue the tick with
// private marks; a waiting sandbox whose process was killed is not handed
// out but replaced, and so is one whose sandbox was killed; Close leaves no
// waiting sandbox and no process.
func checkPrespawnedPool(t *testing.T, p *parked, pool *warmpool.Pool, kind string, pids func(id string) []int) {
	t.Helper()
	first := pool.Waiting()[0]
	servedBy := pids(first)
	if len(servedBy) != 1 {
		t.Fatalf("waiting sandbox %s: runsc %s processes %v, want 1", first, kind, servedBy)
	}
	got := restoreFromPool(t, p, pool, 3)
	if got[0].ID != first {
		t.Fatalf("the first request went to %s, want the oldest waiting sandbox %s", got[0].ID, first)
	}
	if err := processGone(servedBy[0], reapTimeout); err != nil {
		t.Errorf("the waiting runsc %s of %s: %v", kind, first, err)
	}
	if left := pids(first); len(left) != 0 {
		t.Errorf("runsc %s processes of %s after it was handed out: %v", kind, first, left)
	}
	checkPrivateMarks(t, p, got)

	// The oldest waiting sandbox loses its process: the pool must not hand
	// it out, and must replace it.
	waiting := pool.Waiting()
	killed := pids(waiting[0])
	if len(killed) != 1 {
		t.Fatalf("waiting sandbox %s: runsc %s processes %v, want 1", waiting[0], kind, killed)
	}
	if err := killAndReap(killed[0]); err != nil {
		t.Fatal(err)
	}
	s, err := pool.Restore(p.image)
	if err != nil {
		t.Fatalf("request after a waiting runsc %s was killed: %v", kind, err)
	}
	if s.ID == waiting[0] {
		t.Fatalf("the request went to %s, whose runsc %s was killed", s.ID, kind)
	}
	checkFirstTick(t, s.ID, s.Out, p.lastTick)
	got = append(got, s)
	for _, s := range got {
		if !s.Prespawned {
			t.Errorf("%s was served by a runsc %s that the request started, not by its waiting one", s.ID, kind)
		}
	}
	if err := pool.Fill(time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := p.r.Exec("state", waiting[0]); err == nil {
		t.Errorf("sandbox %s, whose runsc %s was killed, still exists", waiting[0], kind)
	}

	// The same when the sandbox itself dies.
	got = append(got, restoreAfterKill(t, p, pool))

	left := pool.Waiting()
	checkPoolClose(t, p, pool, got)
	for _, id := range left {
		if ps := pids(id); len(ps) != 0 {
			t.Errorf("runsc %s processes of %s still run after Close: %v", kind, id, ps)
		}
	}
}
