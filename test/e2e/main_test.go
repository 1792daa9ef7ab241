// Package e2e drives real runsc sandboxes (systrap) built from this
// repository: bin/runsc (the fork) and bin/runsc-upstream (the same pin,
// unpatched). The tests need root and both binaries; without them they skip
// and say why.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forkvisor/forkvisor/internal/prereq"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

var (
	repoRoot string
	// tickBin is the static tick workload, built once by TestMain.
	tickBin string
	// probeBin is the static cloneprobe workload, built once by TestMain.
	probeBin string
	// pauseBin is the static pod sandbox workload of the CRI tests.
	pauseBin string
	// kvserverBin is the static network workload of TestNetworkClones.
	kvserverBin string
)

func TestMain(m *testing.M) {
	root, err := filepath.Abs("../..")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	repoRoot = root
	// A test binary that was killed or timed out while a test had changed
	// the host's huge page settings left them saved (hugepages_test.go).
	if err := restoreHostTHP(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "forkvisor-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tickBin = filepath.Join(dir, "tick")
	probeBin = filepath.Join(dir, "cloneprobe")
	pauseBin = filepath.Join(dir, "pause")
	kvserverBin = filepath.Join(dir, "kvserver")
	for bin, pkg := range map[string]string{tickBin: "./test/workloads/tick", probeBin: "./test/workloads/cloneprobe", pauseBin: "./test/workloads/pause", kvserverBin: "./test/workloads/kvserver"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	before := hostStoreEntries()
	code := m.Run()
	if err := restoreHostTHP(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		code = 1
	}
	os.RemoveAll(dir)
	// Every runsc of the tests has a base store of its own (sandbox.Runsc);
	// one that ran without --base-store would leave its bases in the
	// host's, which nothing removes.
	var added []string
	for _, e := range hostStoreEntries() {
		if !slices.Contains(before, e) {
			added = append(added, e)
		}
	}
	if len(added) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests stored %d base(s) in the host's node base store %s (a runsc without --base-store): %v\n", len(added), hostBaseStore, added)
		code = 1
	}
	os.Exit(code)
}

// hostBaseStore is runsc's default --base-store.
const hostBaseStore = "/var/lib/runsc/bases"

// hostStoreEntries lists the bases in hostBaseStore.
func hostStoreEntries() []string {
	entries, _ := os.ReadDir(filepath.Join(hostBaseStore, "sha256"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// binary returns the path of bin/NAME, or skips the test.
func binary(t *testing.T, name string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Missing(t, "needs root to run runsc sandboxes")
	}
	p := filepath.Join(repoRoot, "bin", name)
	if _, err := os.Stat(p); err != nil {
		prereq.Missing(t, "%s not built (run `make`): %v", p, err)
	}
	return p
}

// newRoot returns a runsc of binary bin with a root of its own under a new
// temporary directory, which it also returns; the test cleans it up.
func newRoot(t *testing.T, bin string) (*sandbox.Runsc, string) {
	t.Helper()
	dir := t.TempDir()
	r := &sandbox.Runsc{Bin: bin, Root: filepath.Join(dir, "root")}
	t.Cleanup(r.Cleanup)
	return r, dir
}

// source is a tick workload running in a sandbox of its own runsc root.
type source struct {
	r      *sandbox.Runsc
	dir    string
	bundle string
	out    string
}

// startSource runs the tick workload (heap of mib MiB, 50 ms ticks, extra
// tick arguments args) as container "source" with the runsc binary name, and
// waits for tick 3.
func startSource(t *testing.T, name string, mib int, args ...string) *source {
	t.Helper()
	bin := binary(t, name)
	dir := t.TempDir()
	s := &source{r: &sandbox.Runsc{Bin: bin, Root: filepath.Join(dir, "root"), Upstream: name == "runsc-upstream"}, dir: dir}
	t.Cleanup(s.r.Cleanup)
	s.bundle = filepath.Join(dir, "bundle")
	if err := sandbox.NewBundle(s.bundle, tickBin, append([]string{"-mib", fmt.Sprint(mib), "-interval", "50ms"}, args...)...); err != nil {
		t.Fatal(err)
	}
	s.out = filepath.Join(dir, "source.out")
	if _, err := s.r.RunUntilTick(s.bundle, "source", s.out, 3, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// park checkpoints the source into image with the extra checkpoint flags,
// removes it, and returns what clones are restored from.
func (s *source) park(t *testing.T, image string, flags ...string) *parked {
	t.Helper()
	if err := s.r.Checkpoint("source", image, flags...); err != nil {
		t.Fatal(err)
	}
	s.r.Destroy("source")
	return &parked{r: s.r, dir: s.dir, bundle: s.bundle, image: image, lastTick: lastTick(t, s.out).N}
}
