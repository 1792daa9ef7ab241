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

// checkpointPhase is a phase of `runsc checkpoint --shared-base` that the
// kill matrix aims at, and how a poller of the image directory sees that it
// has begun. The phases follow the order of runsc/sandbox.Checkpoint.
type checkpointPhase struct {
	name  string
	begun func(image string) bool
}

// sharedBaseCheckpointPhases are the phases of a --shared-base checkpoint
// in the order a poller sees them begin: the sentry writes the state file's
// first bytes before it exports the base, and the delta after.
var sharedBaseCheckpointPhases = []checkpointPhase{
	// From runsc's start until the image's first bytes: runsc creates the
	// image directory and its empty files, the sandbox pauses. Nothing is
	// saved yet.
	{"start", func(string) bool { return true }},
	// The sentry has begun the image's files (paused).
	{"state", func(image string) bool {
		for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
			if st, err := os.Stat(filepath.Join(image, name)); err == nil && st.Size() > 0 {
				return true
			}
		}
		return false
	}},
	// runsc writes base.img as the sentry streams the export to it; the
	// sentry then saves the delta against it.
	{"export", func(image string) bool {
		var st syscall.Stat_t
		return syscall.Stat(filepath.Join(image, "base.img"), &st) == nil && st.Blocks > 0
	}},
	// files.json is written; runsc publishes base.img (and first waits for
	// the sandbox to exit if the sandbox could reach it by a path).
	{"finish", func(image string) bool {
		_, err := os.Stat(filepath.Join(image, "files.json"))
		return err == nil
	}},
	// base.img is read-only: runsc links it into the base store and writes
	// base.json.
	{"publish", func(image string) bool {
		st, err := os.Stat(filepath.Join(image, "base.img"))
		return err == nil && st.Mode().Perm()&0o222 == 0
	}},
	// base.json is written: the image is complete, runsc is exiting. Too
	// short to aim a kill at (runsc exits within a poll or two): it only
	// ends the "publish" phase, and the rounds whose checkpoint ended before
	// their kill show that an image that got this far restores.
	{"recorded", func(image string) bool {
		_, err := os.Stat(filepath.Join(image, "base.json"))
		return err == nil
	}},
}

// checkpointDeadline bounds one checkpoint of the matrix: a hung one fails
// the round instead of the whole test's timeout.
const checkpointDeadline = 2 * time.Minute

// phaseStarts runs cmd to its end, polling image, and returns when each
// phase was first seen to have begun, from the start of cmd (-1: never seen,
// the phase was too short to see), and how long cmd took.
func phaseStarts(t *testing.T, cmd *exec.Cmd, image string) ([]time.Duration, time.Duration, error) {
	t.Helper()
	starts := make([]time.Duration, len(sharedBaseCheckpointPhases))
	for i := range starts {
		starts[i] = -1
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(checkpointDeadline)
	for {
		for i, p := range sharedBaseCheckpointPhases {
			if starts[i] < 0 && p.begun(image) {
				starts[i] = time.Since(start)
			}
		}
		select {
		case err := <-done:
			took := time.Since(start)
			// A phase may begin and end within one poll (base.json
			// is written just before runsc exits): look once more.
			for i, p := range sharedBaseCheckpointPhases {
				if starts[i] < 0 && p.begun(image) {
					starts[i] = took
				}
			}
			return starts, took, err
		case <-deadline:
			cmd.Process.Kill()
			<-done
			t.Fatalf("checkpoint still running after %v", checkpointDeadline)
		case <-time.After(200 * time.Microsecond):
		}
	}
}

// killInPhase starts cmd, waits until phase has begun in image, waits delay
// more and kills cmd and the sandbox process pid (if it still is one). It
// returns whether the kill ended cmd; if cmd ended by itself first, it
// returns false and how it ended.
func killInPhase(t *testing.T, cmd *exec.Cmd, image string, phase checkpointPhase, delay time.Duration, pid int) (bool, error) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(checkpointDeadline)
	for !phase.begun(image) {
		select {
		case err := <-done:
			return false, err
		case <-deadline:
			cmd.Process.Kill()
			<-done
			t.Fatalf("checkpoint still running after %v, phase %s not seen", checkpointDeadline, phase.name)
		case <-time.After(200 * time.Microsecond):
		}
	}
	select {
	case err := <-done:
		return false, err
	case <-time.After(delay):
	}
	cmd.Process.Signal(syscall.SIGKILL)
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), "runsc-sandbox") {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	err := <-done
	// runsc may have exited by itself just before the signal: only a death
	// by SIGKILL is a kill.
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		return true, nil
	}
	return false, err
}

// calibrationRounds is the number of unkilled checkpoints whose phase
// lengths bound the kills: the shortest of each phase is taken, so that a
// slow first round does not aim kills past a phase's end.
const calibrationRounds = 3

// TestKilledSharedBaseCheckpoint kills `runsc checkpoint --shared-base` and
// the sandbox (sentry included) in every phase of the checkpoint
// (sharedBaseCheckpointPhases: start, state, export, finish, publish; the
// last, recorded, only ends publish). The first calibrationRounds rounds are
// not killed: they
// complete however slow the machine, and when the image directory showed
// each phase begin bounds the kills. Each later round aims at one phase in
// turn: it waits until the image directory shows that the phase has begun,
// then kills at a random point within the phase's shortest length in the
// unkilled rounds (FAULT_TRIALS rounds per phase: 3; make faults runs
// more). A round whose checkpoint ended before its kill is not a kill: it
// must restore like an unkilled one. Every killed round must end either
// complete (the clone restores and its heap checks out) or refused before
// the restore hands the image to a sandbox; never a restore that starts
// from a half-written image. Kills in "start" (up to the image's first
// bytes) must be refused. FAULT_SEED replays a run.
func TestKilledSharedBaseCheckpoint(t *testing.T) {
	rng := faultRand(t)
	phases := sharedBaseCheckpointPhases
	// Every phase but the last ("recorded") is killed in.
	killPhases := len(phases) - 1
	rounds := calibrationRounds + faultTrials(t)*killPhases
	type tally struct{ killed, late, complete, refused int }
	byPhase := make([]tally, len(phases))
	// lengths[p] is phase p's shortest length in the unkilled rounds (-1:
	// not seen in one of them).
	lengths := make([]time.Duration, len(phases))
	for i := 0; i < rounds; i++ {
		src := startSource(t, "runsc", 32)
		pid, err := src.r.SandboxPID("source")
		if err != nil {
			t.Fatal(err)
		}
		image := filepath.Join(src.dir, "image")
		cmd := src.r.Command("checkpoint", "--shared-base", "--image-path", image, "source")
		p := -1 // the phase killed in, or -1
		var delay time.Duration
		if i < calibrationRounds {
			starts, took, err := phaseStarts(t, cmd, image)
			if err != nil {
				t.Fatalf("checkpoint that was not killed: %v", err)
			}
			t.Logf("round %d, not killed: the checkpoint takes %v; its phases began at %v", i, took, starts)
			for q := range phases {
				end := took
				if q+1 < len(phases) {
					end = starts[q+1]
				}
				length := end - starts[q]
				if starts[q] < 0 || end < 0 || length < 0 {
					// Not seen, or seen out of order: no aim within it.
					t.Logf("round %d: phase %s not seen in order; its kills land when it is seen", i, phases[q].name)
					length = -1
				}
				if i == 0 || (lengths[q] >= 0 && (length < 0 || length < lengths[q])) {
					lengths[q] = length
				}
			}
			if starts[len(starts)-1] < 0 {
				t.Fatalf("the unkilled checkpoint never showed base.json")
			}
		} else {
			p = (i - calibrationRounds) % killPhases
			if lengths[p] > 0 {
				delay = time.Duration(rng.Int63n(int64(lengths[p])))
			}
			killed, err := killInPhase(t, cmd, image, phases[p], delay, pid)
			if killed {
				byPhase[p].killed++
			} else {
				if err != nil {
					t.Fatalf("round %d: the checkpoint failed by itself before its kill in phase %s: %v", i, phases[p].name, err)
				}
				// Not killed after all: it must restore like an unkilled one.
				byPhase[p].late++
				t.Logf("round %d: the checkpoint ended before its kill in phase %s (+%v)", i, phases[p].name, delay)
				p = -1
			}
		}
		last := lastTick(t, src.out).N
		src.r.Destroy("source")

		id := fmt.Sprintf("round%d", i)
		out := filepath.Join(src.dir, id+".out")
		where := "not killed"
		if p >= 0 {
			where = fmt.Sprintf("killed in phase %s +%v", phases[p].name, delay)
		}
		restoreStart := time.Now()
		if err := src.r.Restore(src.bundle, id, image, out); err != nil {
			if p < 0 {
				t.Fatalf("round %d (%s): restore: %v", i, where, err)
			}
			byPhase[p].refused++
			t.Logf("round %d (%s): refused: %v", i, where, lastLine(err.Error()))
			if strings.Contains(err.Error(), "urpc method") {
				// Refused by the sandbox, not by runsc: the image
				// reached a sandbox before anything checked it.
				t.Errorf("round %d (%s): the half-written image reached a sandbox, which failed on it: %v", i, where, lastLine(err.Error()))
			}
			if list, _ := src.r.Exec("list", "-quiet"); strings.Contains(list, id) {
				// A restore that was refused must not have started.
				t.Errorf("round %d: refused restore left container %s behind", i, id)
			}
			continue
		}
		// A restore that started must run the workload with its heap intact.
		tk, err := sandbox.WaitFirstTick(out, restoreStart)
		if err != nil {
			t.Fatalf("round %d (%s): the restore started, but: %v", i, where, err)
		}
		if p >= 0 && phases[p].name == "start" {
			t.Errorf("round %d (%s): restored an image whose checkpoint was killed before it saved anything", i, where)
		}
		if p >= 0 {
			byPhase[p].complete++
		}
		t.Logf("round %d (%s): complete, restored", i, where)
		checkContinues(t, id, tk, last)
		// Every tick checks 4 MiB of the heap: wait for a full pass.
		waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= last+32/4+1 })
		src.r.Destroy(id)
	}
	var parts []string
	for i, p := range phases[:killPhases] {
		b := byPhase[i]
		parts = append(parts, fmt.Sprintf("%s %d rounds: %d killed (%d complete, %d refused), %d ended first (restored)", p.name, b.killed+b.late, b.killed, b.complete, b.refused, b.late))
	}
	t.Logf("fault summary: killed --shared-base checkpoint, %d rounds (%d not killed, complete): %s", rounds, calibrationRounds, strings.Join(parts, "; "))
}
