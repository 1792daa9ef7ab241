package e2e

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// envCount returns the number in the environment variable name, or def if
// it is not set; a value below least fails the test.
func envCount(t *testing.T, name string, def, least int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < least {
		t.Fatalf("%s=%q is not a number of at least %d", name, s, least)
	}
	return n
}

// faultTrials is the number of trials per case of the fault tests:
// FAULT_TRIALS if set (make faults sets it), else 3.
func faultTrials(t *testing.T) int {
	return envCount(t, "FAULT_TRIALS", 3, 1)
}

// faultRand returns a random source for a fault test, and logs its seed
// (FAULT_SEED replays one).
func faultRand(t *testing.T) *rand.Rand {
	seed := time.Now().UnixNano()
	if s := os.Getenv("FAULT_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("FAULT_SEED=%q: %v", s, err)
		}
	}
	t.Logf("FAULT_SEED=%d", seed)
	return rand.New(rand.NewSource(seed))
}

// copyImage copies the files of image directory src into a new directory
// and returns it. Copies keep their mode (base.img stays read-only and
// root-owned, i.e. published) but are new inodes, which this host has not
// verified.
func copyImage(t *testing.T, src, name string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			sparseCopy(t, filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
		}
	}
	return dst
}

// flipRandomBit inverts one random bit of path and returns its offset.
func flipRandomBit(t *testing.T, rng *rand.Rand, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() == 0 {
		t.Fatalf("%s is empty: nothing to tamper with", path)
	}
	off := rng.Int63n(st.Size())
	xorByteAt(t, path, off, 1<<rng.Intn(8))
	return off
}

// TestTamperedImageRefused flips single bits at random offsets of every file
// that a restore reads from a shared-base image (the state file, the pages
// metadata, the pages of a re-parked clone, files.json) and of base.img,
// both before and after this host verified it: every trial must be refused
// before any task runs, and leave no container behind. FAULT_TRIALS sets the
// trials per file (3; make faults runs more).
func TestTamperedImageRefused(t *testing.T) {
	p := parkSource(t, 32)
	// A clone that wrote its heap (a mark), parked again: its image holds a
	// delta in pages.img.
	out := p.restoreClone(t, "writer", p.image, p.lastTick)
	p.send(t, "writer", "mark")
	waitTick(t, out, 0, "a mark", func(tk sandbox.Tick) bool { return tk.Mark != "" && tk.Mark != "0" })
	repark := filepath.Join(p.dir, "repark")
	if err := p.r.Checkpoint("writer", repark, "--shared-base"); err != nil {
		t.Fatal(err)
	}
	reparkTick := lastTick(t, out).N
	p.r.Destroy("writer")
	rng := faultRand(t)
	trials := faultTrials(t)
	// refused restores image, in which file was tampered with, and
	// requires a refusal by runsc before the sandbox got the image: an
	// error that names the file, files.json or the base's digest, and no
	// output from the workload.
	refused := func(t *testing.T, id, image, file string) {
		t.Helper()
		out := filepath.Join(p.dir, id+".out")
		err := p.r.Restore(p.bundle, id, image, out)
		if err == nil {
			p.r.Destroy(id)
			t.Fatalf("restore of a tampered image started")
		}
		msg := lastLine(err.Error())
		t.Logf("refused: %v", msg)
		if !strings.Contains(msg, file) && !strings.Contains(msg, "files.json") && !strings.Contains(msg, "content digest") {
			t.Errorf("the refusal names neither %s, files.json nor the base's digest: %s", file, msg)
		}
		if lines := sandbox.Lines(out); len(lines) != 0 {
			t.Errorf("the workload of a refused restore printed %q", lines)
		}
		if out, _ := p.r.Exec("list", "-quiet"); strings.Contains(out, id) {
			t.Errorf("refused restore left container %s behind", id)
		}
	}
	for _, tc := range []struct {
		name, image, file string
	}{
		{"state file", repark, "checkpoint.img"},
		{"pages metadata", repark, "pages_meta.img"},
		{"pages", repark, "pages.img"},
		{"file digests", repark, "files.json"},
		{"base not verified on this host", p.image, "base.img"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < trials; i++ {
				dir := copyImage(t, tc.image, fmt.Sprintf("image%d", i))
				off := flipRandomBit(t, rng, filepath.Join(dir, tc.file))
				t.Logf("trial %d: bit flipped at offset %d of %s", i, off, tc.file)
				refused(t, fmt.Sprintf("tampered-%s-%d", strings.ReplaceAll(tc.name, " ", "-"), i), dir, tc.file)
			}
			if !t.Failed() {
				t.Logf("fault summary: bit flip in %s (%s): %d trials, all refused", tc.file, tc.name, trials)
			}
		})
	}
	t.Run("base verified on this host", func(t *testing.T) {
		for i := 0; i < trials; i++ {
			dir := copyImage(t, p.image, fmt.Sprintf("cached%d", i))
			// Restored once, so this host has verified (and cached) it.
			p.restoreClone(t, fmt.Sprintf("verified-%d", i), dir, p.lastTick)
			p.r.Destroy(fmt.Sprintf("verified-%d", i))
			off := flipRandomBit(t, rng, filepath.Join(dir, "base.img"))
			t.Logf("trial %d: bit flipped at offset %d of the verified base.img", i, off)
			refused(t, fmt.Sprintf("tampered-verified-%d", i), dir, "base.img")
		}
		if !t.Failed() {
			t.Logf("fault summary: bit flip in base.img verified on this host: %d trials, all refused", trials)
		}
	})
	// The untouched images still restore.
	p.restoreClone(t, "intact", repark, reparkTick)
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
