package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/cloneprobe"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestCloneContract restores 4 clones of the probe over a shared base, with
// and without the restore signal, and parks clone 0 again: boot IDs are
// fresh per clone, the restore generation counts restores, and the signal
// reaches the probe exactly once per restore, so that its reseeded PRNG
// streams differ.
func TestCloneContract(t *testing.T) {
	bin := binary(t, "runsc")
	for _, tc := range []struct {
		name   string
		signal string
		// pausedFor, if not zero, restores the clones paused and resumes
		// them after that long.
		pausedFor time.Duration
	}{
		{name: "signal", signal: "USR2"},
		{name: "nosignal"},
		// Clones restored with --paused and resumed later: the same
		// contract, the signal delivered exactly once.
		{name: "signal,paused", signal: "USR2", pausedFor: 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			res, err := cloneprobe.Run(cloneprobe.Options{
				Runsc:     &sandbox.Runsc{Bin: bin, Root: filepath.Join(dir, "root")},
				ProbeBin:  probeBin,
				Dir:       dir,
				Clones:    4,
				ParkFlags: []string{"--shared-base"},
				Signal:    tc.signal,
				PausedFor: tc.pausedFor,
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"boot_id", "uuid", "getrandom", "urandom"} {
				if got := cloneprobe.Classify(res, f); got != "fresh" {
					t.Errorf("%s across the clones and the parked sandbox: %s, want fresh", f, got)
				}
			}
			if res.Source.Gen != "0" {
				t.Errorf("restore generation of the started sandbox: %s, want 0", res.Source.Gen)
			}
			for i, c := range res.Clones {
				if c.Gen != "1" {
					t.Errorf("clone %d: restore generation %s, want 1", i, c.Gen)
				}
			}
			if res.Reparked.Gen != "2" {
				t.Errorf("clone 0 parked again and restored: restore generation %s, want 2", res.Reparked.Gen)
			}
			if res.Reparked.Fields["boot_id"] == res.Settled[0].Fields["boot_id"] {
				t.Errorf("clone 0 parked again and restored kept its boot_id %s", res.Reparked.Fields["boot_id"])
			}

			want, wantReparked, wantPRNG := 0, 0, "same in clones"
			if tc.signal != "" {
				want, wantReparked, wantPRNG = 1, 2, "fresh"
			}
			for i, c := range res.Settled {
				if c.Signals != want {
					t.Errorf("clone %d: %d restore signals counted 10 lines after its restore, want %d", i, c.Signals, want)
				}
			}
			if res.Reparked.Signals != wantReparked {
				t.Errorf("clone 0 parked again and restored: %d restore signals counted, want %d", res.Reparked.Signals, wantReparked)
			}
			if got := cloneprobe.Classify(res, "prng"); got != wantPRNG {
				t.Errorf("the probe's PRNG streams across clones: %s, want %s", got, wantPRNG)
			}
			// What stays identical: the address-space layout.
			if got := cloneprobe.Classify(res, "addr"); got != "identical" {
				t.Errorf("mapping address across clones: %s, want identical", got)
			}
		})
	}
}

// TestRestoreSignalRefused checks that an invalid restore signal annotation
// is refused before a sandbox starts, naming the spec file.
func TestRestoreSignalRefused(t *testing.T) {
	r, dir := newRoot(t, binary(t, "runsc"))
	bundle := filepath.Join(dir, "bundle")
	if err := sandbox.NewBundle(bundle, probeBin); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "source.out")
	if err := r.Run(bundle, "source", out); err != nil {
		t.Fatal(err)
	}
	if _, err := cloneprobe.WaitSample(out, 30*time.Second, func(s cloneprobe.Sample) bool { return s.N >= 2 }); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dir, "image")
	if err := r.Checkpoint("source", image, "--shared-base"); err != nil {
		t.Fatal(err)
	}
	r.Destroy("source")
	for _, v := range []string{"KILL", "USR3"} {
		if err := sandbox.Annotate(bundle, map[string]string{cloneprobe.SignalAnnotation: v}); err != nil {
			t.Fatal(err)
		}
		err := r.Restore(bundle, "clone", image, filepath.Join(dir, "clone.out"))
		if err == nil {
			t.Fatalf("restore with %s=%s succeeded", cloneprobe.SignalAnnotation, v)
		}
		for _, want := range []string{cloneprobe.SignalAnnotation, filepath.Join(bundle, "config.json"), v} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("restore with %s=%s: error %q does not name %q", cloneprobe.SignalAnnotation, v, err, want)
			}
		}
		if list, _ := r.Exec("list", "-quiet"); strings.TrimSpace(list) != "" {
			t.Errorf("restore with %s=%s left containers behind: %q", cloneprobe.SignalAnnotation, v, list)
		}
	}
}
