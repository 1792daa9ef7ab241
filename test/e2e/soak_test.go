package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// soakRounds is the number of park/restore rounds of TestParkRestoreSoak:
// SOAK_ROUNDS if set, else 100.
func soakRounds(t *testing.T) int {
	if s := os.Getenv("SOAK_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2 {
			t.Fatalf("SOAK_ROUNDS=%q is not a number of at least 2", s)
		}
		return n
	}
	return 100
}

// hostState is what a park/restore round must not leak on the host.
type hostState struct {
	fds, mounts, rootEntries, storeEntries, processes int
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}

func countEntries(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(entries)
}

func snapshotHost(t *testing.T, r *sandbox.Runsc) hostState {
	t.Helper()
	return hostState{
		fds:          countEntries(t, "/proc/self/fd"),
		mounts:       countLines(t, "/proc/self/mountinfo"),
		rootEntries:  countEntries(t, r.Root),
		storeEntries: countEntries(t, filepath.Join(r.StorePath(), "sha256")),
		processes:    len(sandbox.PIDsByArg(r.Root)),
	}
}

// TestParkRestoreSoak parks and resumes one sandbox over and over, each
// generation restored from the last one's image and parked again over the
// same shared base, as an orchestrator that parks sandboxes all day does.
// Every generation must resume with its heap intact and its ticks
// continuing; and after the last one nothing may have leaked on the host:
// no process of the runtime, no mount, no file descriptor of the caller, no
// state file in runsc's root, one base in the node store, and a delta image
// that did not grow with the generations.
func TestParkRestoreSoak(t *testing.T) {
	rounds := soakRounds(t)
	p := parkSource(t, 16)
	baseline := snapshotHost(t, p.r)
	if baseline.storeEntries != 1 || baseline.processes != 0 {
		t.Fatalf("after the first park: %+v; want one stored base and no process", baseline)
	}
	image, last := p.image, p.lastTick
	var firstDelta int64
	for i := 1; i <= rounds; i++ {
		id := fmt.Sprintf("gen%d", i)
		out := p.restoreClone(t, id, image, last)
		tk := lastTick(t, out)
		if !tk.OK || tk.N <= last {
			t.Fatalf("generation %d: tick %d (ok=%t) after parking at tick %d", i, tk.N, tk.OK, last)
		}
		next := filepath.Join(p.dir, fmt.Sprintf("image-%d", i))
		if err := p.r.Checkpoint(id, next, "--shared-base"); err != nil {
			t.Fatalf("generation %d: %v", i, err)
		}
		p.r.Destroy(id)
		last = lastTick(t, out).N
		if image != p.image {
			if err := os.RemoveAll(image); err != nil {
				t.Fatal(err)
			}
		}
		image = next
		st, err := os.Stat(filepath.Join(image, "pages.img"))
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			firstDelta = st.Size()
		}
		if i == rounds {
			t.Logf("%d generations; delta of the first %d bytes, of the last %d bytes", rounds, firstDelta, st.Size())
			if st.Size() > 2*firstDelta+(1<<20) {
				t.Errorf("the delta grew from %d to %d bytes over %d generations of an idle workload", firstDelta, st.Size(), rounds)
			}
		}
	}
	if got := snapshotHost(t, p.r); got != baseline {
		t.Errorf("after %d park/restore rounds the host holds %+v; before them %+v", rounds, got, baseline)
	}
	// The last generation still resumes.
	p.restoreClone(t, "final", image, last)
}
