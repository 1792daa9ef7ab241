package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestKilledSharedBaseCheckpoint kills `runsc checkpoint --shared-base` and
// the sandbox (sentry included) at random points from before the
// checkpoint starts to when it ends (save, files.json, publish, base store,
// base.json): once not at all, once at once, and FAULT_TRIALS times at
// random within the time the first took (3; make faults runs more). Every
// round must end either complete (the clone restores and its heap checks
// out) or refused before the restore hands the image to a sandbox; never a
// restore that starts from a half-written image. The random kills land
// mostly while the sentry saves (the save is most of the time); FAULT_SEED
// replays a run, and its log says where each kill landed.
func TestKilledSharedBaseCheckpoint(t *testing.T) {
	rng := faultRand(t)
	rounds := faultTrials(t) + 2
	var complete, refused int
	// The first round is not killed: it completes however slow the
	// machine, and its duration bounds the kills of the others. The second
	// is killed at once (nothing saved: refused); the others at random
	// within that duration.
	var took time.Duration
	for i := 0; i < rounds; i++ {
		var delay time.Duration
		switch {
		case i == 0:
			delay = -1
		case i > 1:
			delay = time.Duration(rng.Int63n(int64(took)))
		}
		src := startSource(t, "runsc", 32)
		pid, err := src.r.SandboxPID("source")
		if err != nil {
			t.Fatal(err)
		}
		image := filepath.Join(src.dir, "image")
		cmd := exec.Command(src.r.Bin, "--root", src.r.Root, "--network=none", "--platform=systrap", "checkpoint", "--shared-base", "--image-path", image, "source")
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if delay >= 0 {
			time.Sleep(delay)
			cmd.Process.Signal(syscall.SIGKILL)
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), "runsc-sandbox") {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		err = cmd.Wait()
		if i == 0 {
			if err != nil {
				t.Fatalf("checkpoint that was not killed: %v", err)
			}
			took = time.Since(start)
			t.Logf("a checkpoint takes %v: kills fall within it", took)
		}
		last := lastTick(t, src.out).N
		src.r.Destroy("source")

		id := fmt.Sprintf("round%d", i)
		out := filepath.Join(src.dir, id+".out")
		tk, _, err := src.r.RestoreFirstTick(src.bundle, id, image, out)
		if err != nil {
			refused++
			t.Logf("round %d (killed after %v): refused: %v", i, delay, lastLine(err.Error()))
			if list, _ := src.r.Exec("list", "-quiet"); strings.Contains(list, id) {
				// A restore that was refused must not have started.
				t.Errorf("round %d: refused restore left container %s behind", i, id)
			}
			continue
		}
		complete++
		t.Logf("round %d (killed after %v; -1: not killed): complete, restored", i, delay)
		checkContinues(t, id, tk, last)
		// Every tick checks 4 MiB of the heap: wait for a full pass.
		waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= last+32/4+1 })
		src.r.Destroy(id)
	}
	t.Logf("fault summary: killed --shared-base checkpoint: %d rounds, %d complete and restored intact, %d refused", rounds, complete, refused)
}
