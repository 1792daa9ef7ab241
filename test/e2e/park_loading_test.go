package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/pauselog"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestParkWhileLoading parks a sandbox whose memory a `restore
// --background` is still loading (a 128 MiB heap loaded at loadRate,
// --TESTONLY-async-page-load-rate, so that the load outlasts the park's
// start on any machine). The save must wait for the load first, before the
// save hooks and the pause, as the sandbox's log says, and the park must
// restore with its heap intact. The pause that the sentry
// logged is printed (REPRODUCE.md §13).
func TestParkWhileLoading(t *testing.T) {
	const mib, loadRate = 128, 16 << 20
	src := startSource(t, "runsc", mib)
	full := filepath.Join(src.dir, "full")
	p := src.park(t, full)
	// Logs from the restore on: the park's are the only save in them.
	p.r.LogDir, p.r.LogInfo = t.TempDir(), true
	out := filepath.Join(src.dir, "loading.out")
	restoreLoading(t, p.r, p.bundle, "loading", full, out, loadRate)
	image := filepath.Join(src.dir, "image")
	err := p.r.Checkpoint("loading", image)
	p.r.Destroy("loading")
	if err != nil {
		t.Fatal(err)
	}
	// The wait must come before the save hooks, which run before Save logs
	// its CPU usage.
	if !logsInOrder(t, p.r.LogDir, func(l string) bool {
		return strings.Contains(l, "the main MemoryFile is still being loaded by the restore (--background): waiting for the load before")
	}, "Before save CPU usage") {
		t.Errorf("no sandbox log in %s says that the park waited for the load before the save hooks and the pause, which at %d MiB/s should have outlasted the park's start", p.r.LogDir, loadRate>>20)
	}
	checkPauseOutsideLoad(t, p.r.LogDir, mib<<20/loadRate)
	// The clone continues from the loading sandbox's last tick, or from
	// the source's if the park came before the loading sandbox's first.
	last := p.lastTick
	if len(sandbox.Lines(out)) > 0 {
		last = lastTick(t, out).N
	}
	p.restoreClone(t, "clone", image, last)
}

// checkPauseOutsideLoad prints the resume lines that the saves logged under
// dir and fails if the park's pause (pauselog) lasted half of loadSeconds or
// more: a park that began while a load of loadSeconds ran, and held the rest
// of that load in its pause. (A pause without the load lasts tens of
// milliseconds here; REPRODUCE.md §13.)
func checkPauseOutsideLoad(t *testing.T, dir string, loadSeconds int) {
	t.Helper()
	for _, l := range logLines(t, dir, "the sandbox was paused for") {
		t.Logf("park of a loading sandbox: %s", l[strings.Index(l, "]")+1:])
	}
	d, err := pauselog.Dir(dir)
	if err != nil {
		t.Errorf("how long the park paused the sandbox: %v", err)
		return
	}
	if limit := time.Duration(loadSeconds) * time.Second / 2; d >= limit {
		t.Errorf("the park paused the sandbox for %s, at least half of the %ds load: the load was held in the pause", d, loadSeconds)
	}
}

// TestCheckpointRefusedBeforeLoadWait parks, without --shared-base, a clone
// whose layer (a filestore saved in its image) a restore --background still
// loads, slowly. The park would silently need the base the clone runs over,
// so it is refused, and at once: the sandbox's log shows no wait for the
// load before the refusal. The clone then parks with --shared-base, which
// waits for the load (as its log must say, or the test proved nothing).
func TestCheckpointRefusedBeforeLoadWait(t *testing.T) {
	const fileMiB, loadRate = 64, 8 << 20
	e := newLayerEnv(t, fileMiB)
	e.start(t, "source")
	image := filepath.Join(e.dir, "image")
	if err := e.r.Checkpoint("source", image, "--shared-base"); err != nil {
		t.Fatal(err)
	}
	e.r.Destroy("source")
	e.r.LogDir, e.r.LogInfo = t.TempDir(), true
	restoreLoading(t, e.r, e.bundle, "loading", image, filepath.Join(e.dir, "loading.out"), loadRate)
	defer e.r.Destroy("loading")
	const waitLine = "is still being loaded by the restore (--background): waiting for the load"
	err := e.r.Checkpoint("loading", filepath.Join(e.dir, "plain"))
	if err == nil || !strings.Contains(err.Error(), "checkpoint it with --shared-base") {
		t.Fatalf("plain checkpoint of a clone: %v; want a refusal naming --shared-base", err)
	}
	if logsContain(t, e.r.LogDir, waitLine) {
		t.Errorf("the refused park waited for the restore's load first (logs in %s)", e.r.LogDir)
	}
	if err := e.r.Checkpoint("loading", filepath.Join(e.dir, "again"), "--shared-base"); err != nil {
		t.Fatalf("park with --shared-base after the refusal: %v", err)
	}
	if !logsContain(t, e.r.LogDir, waitLine) {
		t.Errorf("the park after the refusal did not wait for the restore's load: at %d MiB/s it should still have been loading (logs in %s)", loadRate>>20, e.r.LogDir)
	}
}

// TestCheckpointKilledDuringLoadWait kills `runsc checkpoint` (SIGKILL, as
// an orchestrator's timeout would) while the sandbox's save waits for a
// restore --background's page loading, slowed as above. The sandbox must
// give the save up at once (its log says so), never pause for it, and keep
// running after the load has ended: before the caller pipe, it saved into
// the killed checkpoint's files once the load ended, and exited.
func TestCheckpointKilledDuringLoadWait(t *testing.T) {
	const mib, loadRate = 64, 8 << 20
	src := startSource(t, "runsc", mib)
	p := src.park(t, filepath.Join(src.dir, "full"))
	p.r.LogDir, p.r.LogInfo = t.TempDir(), true
	out := filepath.Join(src.dir, "loading.out")
	restoreLoading(t, p.r, p.bundle, "loading", p.image, out, loadRate)
	defer p.r.Destroy("loading")
	loadEnd := time.Now().Add(time.Duration(mib<<20/loadRate) * time.Second)

	cmd := p.r.Command("checkpoint", "--image-path", filepath.Join(src.dir, "image"), "loading")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForLog := func(what, s string, timeout time.Duration) bool {
		t.Helper()
		for deadline := time.Now().Add(timeout); !logsContain(t, p.r.LogDir, s); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("no sandbox log in %s says %s (%q) after %s", p.r.LogDir, what, s, timeout)
				return false
			}
		}
		return true
	}
	if !waitForLog("that the save waits for the load", "the main MemoryFile is still being loaded by the restore (--background): waiting for the load", 30*time.Second) {
		cmd.Process.Kill()
		t.FailNow()
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	waitForLog("that the save gave up", "the checkpoint's caller went away while the save waited for the restore's page loading", 5*time.Second)

	// Past the load's end, the sandbox must still tick, and never have
	// begun a save.
	time.Sleep(time.Until(loadEnd) + 2*time.Second)
	from := len(sandbox.Lines(out))
	if _, _, err := sandbox.WaitForLine(out, from, 10*time.Second, func(string) bool { return true }); err != nil {
		t.Errorf("the sandbox stopped ticking after its checkpoint was killed and its load ended: %v", err)
	}
	if logsContain(t, p.r.LogDir, "Sandbox save started") {
		t.Errorf("the sandbox saved after its checkpoint was killed (logs in %s)", p.r.LogDir)
	}
	// A park into the killed checkpoint's directory is refused before the
	// sandbox is touched, naming the file it left and what to do, and leaves
	// that directory as it was.
	killed := filepath.Join(src.dir, "image")
	// The killed checkpoint's files are empty; a byte in the last one it
	// created shows that none is truncated or created again.
	if err := os.WriteFile(filepath.Join(killed, "pages.img"), []byte("x"), 0o644); err != nil {
		t.Fatalf("the killed checkpoint left no pages.img: %v", err)
	}
	before := dirSums(t, killed)
	if err := p.r.Checkpoint("loading", killed); err == nil {
		t.Errorf("park into %s, which a killed checkpoint left, succeeded", killed)
	} else {
		for _, want := range []string{filepath.Join(killed, "checkpoint.img"), "already exists", "--image-path"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("park into the killed checkpoint's directory: %v; want it to say %q", err, want)
			}
		}
	}
	if after := dirSums(t, killed); !reflect.DeepEqual(after, before) {
		t.Errorf("the refused park changed %s: %v, was %v", killed, after, before)
	}
	if logsContain(t, p.r.LogDir, "Sandbox save started") {
		t.Errorf("the refused park started a save (logs in %s)", p.r.LogDir)
	}
	// The sandbox can still be parked elsewhere, and the park restores.
	image := filepath.Join(src.dir, "again")
	if err := p.r.Checkpoint("loading", image); err != nil {
		t.Fatalf("park after the killed checkpoint: %v", err)
	}
	p.restoreClone(t, "clone", image, lastTick(t, out).N)
}

// restoreLoading restores id from image with --background, its pages file
// loaded at rate bytes per second (--TESTONLY-async-page-load-rate), so that
// the load outlasts what the test does next on any machine.
func restoreLoading(t *testing.T, r *sandbox.Runsc, bundle, id, image, out string, rate int) {
	t.Helper()
	flags := r.Flags
	r.Flags = append(append([]string(nil), flags...), fmt.Sprintf("--TESTONLY-async-page-load-rate=%d", rate))
	err := r.Restore(bundle, id, image, out, "--background")
	r.Flags = flags
	if err != nil {
		t.Fatal(err)
	}
}
