package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/pauselog"
	"github.com/forkvisor/forkvisor/internal/prereq"
	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/xfs"
)

// snapshotManifest mirrors runsc's filestores.json (filestoreadopt.Manifest:
// the same fields in the same order), so that a test can rewrite it as
// runsc writes it: indented by two spaces, with a final newline.
type snapshotManifest struct {
	Version     int    `json:"version"`
	SnapshotSet string `json:"snapshot_set"`
	Filestores  []struct {
		File              string `json:"file"`
		ResourceContainer string `json:"resource_container"`
		ResourcePath      string `json:"resource_path"`
		SizeBytes         uint64 `json:"size_bytes"`
		ChunkCount        uint64 `json:"chunk_count"`
		Fingerprint       string `json:"fingerprint"`
	} `json:"filestores"`
}

// layerEnv is a source sandbox whose root filesystem (and so its self
// filestore) lives on a loopback XFS with reflink.
type layerEnv struct {
	r      *sandbox.Runsc
	fs     *xfs.FS // nil for newLayerEnvIn
	dir    string  // on fs, if any
	bundle string
}

func newLayerEnv(t *testing.T, fileMiB int) *layerEnv {
	t.Helper()
	return newLayerEnvOn(t, fileMiB, 8<<30)
}

// newLayerEnvOn is newLayerEnv on an XFS of fsBytes.
func newLayerEnvOn(t *testing.T, fileMiB int, fsBytes int64) *layerEnv {
	t.Helper()
	if why := xfs.Available(); why != "" {
		prereq.Missing(t, "%s", why)
	}
	fs, err := xfs.Mount(t.TempDir(), fsBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fs.Unmount)
	e := newLayerEnvIn(t, fileMiB, fs.Dir)
	e.fs = fs
	return e
}

// newLayerEnvIn is newLayerEnv in dir, on whatever filesystem holds it; its
// fs is nil.
func newLayerEnvIn(t *testing.T, fileMiB int, dir string) *layerEnv {
	t.Helper()
	bin := binary(t, "runsc")
	e := &layerEnv{dir: dir}
	// The node base store on the same filesystem as the images, so that
	// images link their base (as on a node that keeps both on one disk).
	e.r = &sandbox.Runsc{Bin: bin, Root: filepath.Join(t.TempDir(), "root"), BaseStore: filepath.Join(dir, "bases")}
	t.Cleanup(e.r.Cleanup)
	e.bundle = filepath.Join(e.dir, "bundle")
	if err := sandbox.NewBundle(e.bundle, tickBin, "-mib", "16", "-interval", "50ms", "-file", "/layer.bin", "-file-mib", fmt.Sprint(fileMiB)); err != nil {
		t.Fatal(err)
	}
	return e
}

// start runs id and waits until its layer file is written and checked.
func (e *layerEnv) start(t *testing.T, id string) string {
	t.Helper()
	out := filepath.Join(e.dir, id+".out")
	if _, err := e.r.RunUntilTick(e.bundle, id, out, 2, func(tk sandbox.Tick) bool { return tk.File == "ok" }); err != nil {
		t.Fatal(err)
	}
	return out
}

// park checkpoints id with its filestores kept out of the image.
func (e *layerEnv) park(t *testing.T, id, name string) (image, snap string) {
	t.Helper()
	image, snap = filepath.Join(e.dir, name+"-image"), filepath.Join(e.dir, name+"-snap")
	if err := e.r.Checkpoint(id, image, "--skip-filestore-pages", "--filestore-snapshot-dir="+snap); err != nil {
		t.Fatal(err)
	}
	return image, snap
}

// adopt restores id from image adopting snap, and returns its output and
// first tick, which must have an intact heap and layer.
func (e *layerEnv) adopt(t *testing.T, id, image, snap string) (string, sandbox.Tick) {
	t.Helper()
	out := filepath.Join(e.dir, id+".out")
	tk, _, err := e.r.RestoreFirstTick(e.bundle, id, image, out, "--filestore-adopt-dir="+snap)
	if err != nil {
		t.Fatal(err)
	}
	return out, tk
}

// fullCheck waits until id's output shows its whole layer checked, and
// returns the tick.
func fullCheck(t *testing.T, out string, fileMiB int) sandbox.Tick {
	t.Helper()
	from := len(sandbox.Lines(out))
	first, _, err := sandbox.WaitForLine(out, from, 30*time.Second, sandbox.IsTick)
	if err != nil {
		t.Fatal(err)
	}
	ft, _ := sandbox.ParseTick(first)
	var got sandbox.Tick
	if _, _, err := sandbox.WaitForLine(out, from, 60*time.Second, func(l string) bool {
		tk, err := sandbox.ParseTick(l)
		if err != nil {
			return false
		}
		got = tk
		return tk.File == "BAD" || !tk.OK || tk.N >= ft.N+fileMiB/4+2
	}); err != nil {
		t.Fatal(err)
	}
	if got.File != "ok" || !got.OK {
		t.Fatalf("%s: layer %s, heap ok=%t at tick %d", out, got.File, got.OK, got.N)
	}
	return got
}

func (e *layerEnv) fileMark(t *testing.T, id, out string) string {
	t.Helper()
	if _, err := e.r.Exec("exec", id, "/workload", "-send", "filemark"); err != nil {
		t.Fatal(err)
	}
	line, _, err := sandbox.WaitForLine(out, len(sandbox.Lines(out)), 30*time.Second, func(l string) bool {
		tk, err := sandbox.ParseTick(l)
		return err == nil && tk.FileMark != "" && tk.FileMark != "0"
	})
	if err != nil {
		t.Fatal(err)
	}
	tk, _ := sandbox.ParseTick(line)
	return tk.FileMark
}

func lastTick(t *testing.T, out string) sandbox.Tick {
	t.Helper()
	lines := sandbox.Lines(out)
	tk, err := sandbox.ParseTick(lines[len(lines)-1])
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// dirSums returns a digest of every file in dir, reading only data extents
// (snapshots are sparse files of 1 GiB and more).
func dirSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		st, _ := f.Stat()
		fmt.Fprintf(h, "size=%d\n", st.Size())
		buf := make([]byte, 1<<20)
		for off := int64(0); off < st.Size(); {
			data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
			if err != nil {
				break
			}
			hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
			if err != nil {
				t.Fatal(err)
			}
			for p := data; p < hole; {
				n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
				fmt.Fprintf(h, "@%d", p)
				h.Write(buf[:n])
				p += int64(n)
				if err != nil {
					break
				}
			}
			off = hole
		}
		f.Close()
		sums[e.Name()] = fmt.Sprintf("%x", h.Sum(nil))
	}
	return sums
}

// TestFilestoreParkFanOutLineage parks a sandbox with a 64 MiB writable
// layer without copying the layer into the image, fans it out into
// write-isolated clones that adopt reflink copies of the snapshot, and parks
// a clone again for a further generation. The snapshot never changes.
func TestFilestoreParkFanOutLineage(t *testing.T) {
	const fileMiB = 64
	e := newLayerEnv(t, fileMiB)
	srcOut := e.start(t, "source")
	srcMark := e.fileMark(t, "source", srcOut)

	image, snap := e.park(t, "source", "gen1")
	e.r.Destroy("source")
	last := lastTick(t, srcOut)
	var m struct {
		Version     int
		SnapshotSet string `json:"snapshot_set"`
		Filestores  []struct {
			File         string `json:"file"`
			ResourcePath string `json:"resource_path"`
			SizeBytes    uint64 `json:"size_bytes"`
		}
	}
	b, err := os.ReadFile(filepath.Join(snap, "filestores.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 2 || m.SnapshotSet == "" || len(m.Filestores) != 1 || m.Filestores[0].ResourcePath != "/" {
		t.Fatalf("filestores.json: %s (%v)", b, err)
	}
	// The layer is not in the image: pages.img holds the memory only (a
	// 16 MiB heap and the Go runtime), well below the layer's size.
	if st, err := os.Stat(filepath.Join(image, "pages.img")); err != nil || st.Size() >= int64(fileMiB)<<20/2 {
		t.Errorf("pages.img: %v, %d bytes; want less than half of the %d MiB layer, which should not be in it", err, st.Size(), fileMiB)
	}
	snapSums := dirSums(t, snap)

	// Fan out: each clone starts with the source's layer and mark, and its
	// own writes stay its own.
	const clones = 3
	outs := make([]string, clones)
	marks := map[string]bool{srcMark: true}
	cloneMark := make([]string, clones)
	for i := range outs {
		id := fmt.Sprintf("clone%d", i)
		out, first := e.adopt(t, id, image, snap)
		if first.N != last.N+1 || first.FileMark != srcMark {
			t.Fatalf("%s: first tick %d filemark %s; want %d and the source's %s", id, first.N, first.FileMark, last.N+1, srcMark)
		}
		outs[i] = out
		fullCheck(t, out, fileMiB)
	}
	for i, out := range outs {
		mk := e.fileMark(t, fmt.Sprintf("clone%d", i), out)
		if marks[mk] {
			t.Fatalf("clone %d's layer mark %s is not its own", i, mk)
		}
		marks[mk] = true
		cloneMark[i] = mk
	}
	for i, out := range outs {
		if tk := fullCheck(t, out, fileMiB); tk.FileMark != cloneMark[i] {
			t.Errorf("clone %d: layer mark %s, want its own %s", i, tk.FileMark, cloneMark[i])
		}
	}

	// Lineage: clone 0 parked again and fanned out, then once more.
	image2, snap2 := e.park(t, "clone0", "gen2")
	e.r.Destroy("clone0")
	for _, id := range []string{"gen2a", "gen2b"} {
		out, first := e.adopt(t, id, image2, snap2)
		if first.FileMark != cloneMark[0] {
			t.Errorf("%s: layer mark %s, want clone0's %s", id, first.FileMark, cloneMark[0])
		}
		fullCheck(t, out, fileMiB)
	}
	image3, snap3 := e.park(t, "gen2a", "gen3")
	e.r.Destroy("gen2a")
	out, first := e.adopt(t, "gen3", image3, snap3)
	if first.FileMark != cloneMark[0] {
		t.Errorf("gen3: layer mark %s, want %s", first.FileMark, cloneMark[0])
	}
	fullCheck(t, out, fileMiB)

	if got := dirSums(t, snap); fmt.Sprint(got) != fmt.Sprint(snapSums) {
		t.Errorf("the first snapshot changed:\nbefore %v\nafter  %v", snapSums, got)
	}
}

// TestFilestoreDirtyParkLogsPause parks a sandbox with --leave-running right
// after it wrote its 64 MiB layer (nothing flushed by the test): the
// sandbox's log states how long the save paused it (its size goes to the
// benchmark, forkbench's layers-dirty), the source keeps ticking with its
// layer, and a clone adopting the snapshot has the whole layer intact.
func TestFilestoreDirtyParkLogsPause(t *testing.T) {
	const fileMiB = 64
	e := newLayerEnv(t, fileMiB)
	e.r.LogDir, e.r.LogInfo = t.TempDir(), true
	srcOut := e.start(t, "source")

	image, snap := filepath.Join(e.dir, "dirty-image"), filepath.Join(e.dir, "dirty-snap")
	if err := e.r.Checkpoint("source", image, "--skip-filestore-pages", "--filestore-snapshot-dir="+snap, "--leave-running"); err != nil {
		t.Fatal(err)
	}
	pause, err := pauselog.Dir(e.r.LogDir)
	if err != nil {
		t.Fatalf("the park's pause: %v", err)
	}
	if !logsContain(t, e.r.LogDir, "the sandbox was paused for ") {
		t.Errorf("no sandbox log in %s says how long the sandbox was paused", e.r.LogDir)
	}
	t.Logf("a park of a %d MiB layer written just before it paused the sandbox for %v", fileMiB, pause)

	// The source runs on with its layer.
	fullCheck(t, srcOut, fileMiB)
	out, first := e.adopt(t, "clone", image, snap)
	if first.File != "ok" {
		t.Errorf("clone's first tick: layer %s", first.File)
	}
	if tk := fullCheck(t, out, fileMiB); tk.File != "ok" {
		t.Errorf("clone's layer after a full pass: %s", tk.File)
	}
}

// TestFilestoreParkWhileLoading parks a layer that a `restore --background`
// is still loading when the park starts (a filestore's pages are loaded
// after the main memory) and adopts its snapshot: every byte of the layer
// must be in it. A snapshot cloned before the load ended would hold holes
// where the pages not yet loaded were, which the image's metadata calls
// committed: the clone would read zeroes there, and no check could tell.
// The park waits for the load before it pauses the sandbox (and the pause
// waits again, which then finds it done). The restore loads at loadRate
// (--TESTONLY-async-page-load-rate), so that the load outlasts the park's
// start on any machine; the sandbox's log must say that the park waited
// before it wrote the layer back (waitedBeforePreparing), and the pause that
// it logged must be short of the load (checkPauseOutsideLoad).
func TestFilestoreParkWhileLoading(t *testing.T) {
	const fileMiB, loadRate = 512, 64 << 20
	e := newLayerEnv(t, fileMiB)
	e.start(t, "source")
	full := filepath.Join(e.dir, "full-image")
	if err := e.r.Checkpoint("source", full); err != nil {
		t.Fatal(err)
	}
	e.r.Destroy("source")
	// Logs from the restore on: the park's are the only save in them.
	e.r.LogDir, e.r.LogInfo = t.TempDir(), true
	restoreLoading(t, e.r, e.bundle, "loading", full, filepath.Join(e.dir, "loading.out"), loadRate)
	image, snap := e.park(t, "loading", "loading")
	e.r.Destroy("loading")
	if !waitedBeforePreparing(t, e.r.LogDir) {
		t.Errorf("no sandbox log in %s says that the park waited for the layer's load before pausing, which at %d MiB/s should have outlasted the park's start", e.r.LogDir, loadRate>>20)
	}
	checkPauseOutsideLoad(t, e.r.LogDir, fileMiB<<20/loadRate)
	out, first := e.adopt(t, "clone", image, snap)
	if first.File != "ok" {
		t.Errorf("clone's first tick: layer %s", first.File)
	}
	if tk := fullCheck(t, out, fileMiB); tk.File != "ok" {
		t.Errorf("clone's layer after a full pass: %s", tk.File)
	}
}

// waitedBeforePreparing reports whether a sandbox log under dir says that a
// park waited for a filestore's load before it prepared the filestores'
// snapshots (wrote the layer back): a wait after that would leave what the
// load wrote to the writeback of FICLONE, inside the pause.
func waitedBeforePreparing(t *testing.T, dir string) bool {
	t.Helper()
	return logsInOrder(t, dir, func(l string) bool {
		return strings.Contains(l, "is still being loaded by the restore (--background): waiting for the load before") && strings.Contains(strings.ToLower(l), "filestore")
	}, "Prepared the snapshots of")
}

// logsInOrder reports whether one log file under dir has a line for which
// first is true before its first line that contains then.
func logsInOrder(t *testing.T, dir string, first func(line string) bool, then string) bool {
	t.Helper()
	for _, f := range readLogs(t, dir) {
		seen := false
		for _, l := range f.lines {
			if first(l) {
				seen = true
			}
			if strings.Contains(l, then) {
				if seen {
					return true
				}
				break
			}
		}
	}
	return false
}

// TestFilestoreParkWritesBackOnlyItsLayer parks a sandbox while another
// file on the same filesystem (a neighbour's layer, or anything the host
// wrote there) has 256 MiB of dirty pages: the park writes back its own
// layer before it pauses the sandbox, as its log says, and leaves the
// neighbour's pages to the kernel's writeback (a flush of the whole
// filesystem would write them all inside the park). The device's written
// bytes during the park must stay below the neighbour's size, and the
// neighbour's own fdatasync afterwards must still find its pages dirty
// (else the kernel wrote them back on its own and the run shows nothing).
func TestFilestoreParkWritesBackOnlyItsLayer(t *testing.T) {
	const fileMiB, neighbourMiB = 16, 256
	e := newLayerEnv(t, fileMiB)
	e.r.LogDir, e.r.LogInfo = t.TempDir(), true
	e.start(t, "source")

	// Non-zero pages, written through the page cache and not synced.
	chunk := bytes.Repeat([]byte("neighbour"), (1<<20)/9+1)[:1<<20]
	f, err := os.Create(filepath.Join(e.dir, "neighbour.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := 0; i < neighbourMiB; i++ {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	before, err := e.fs.BytesWritten()
	if err != nil {
		t.Fatalf("the loop device's written bytes: %v", err)
	}
	image, snap := e.park(t, "source", "neighbour")
	after, err := e.fs.BytesWritten()
	if err != nil {
		t.Fatalf("the loop device's written bytes: %v", err)
	}
	written := after - before
	t.Logf("the park wrote %d MiB to the device (its layer: %d MiB, a neighbour's dirty file: %d MiB)", written>>20, fileMiB, neighbourMiB)
	if written >= neighbourMiB<<20 {
		t.Errorf("the park wrote %d MiB to the filesystem's device, at least the %d MiB of a neighbour's dirty file: it flushed more than its own layer", written>>20, neighbourMiB)
	} else {
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
		synced, err := e.fs.BytesWritten()
		if err != nil {
			t.Fatalf("the loop device's written bytes: %v", err)
		}
		if control := synced - after; control < neighbourMiB<<20/2 {
			t.Fatalf("the neighbour's fdatasync after the park wrote only %d MiB of its %d MiB: the kernel wrote it back on its own, so this run cannot tell what the park wrote back", control>>20, neighbourMiB)
		}
	}
	if !logsContain(t, e.r.LogDir, "Prepared the snapshots of 1 filestores") {
		t.Errorf("no sandbox log in %s says that the park wrote back its filestore before pausing", e.r.LogDir)
	}
	_, first := e.adopt(t, "clone", image, snap)
	if first.File != "ok" {
		t.Errorf("clone's first tick: layer %s", first.File)
	}
}

// TestFilestoreSnapshotDirWithoutReflink parks sandboxes where FICLONE
// fails: into a snapshot directory on another filesystem than the
// filestores' (EXDEV), and from filestores on a filesystem without reflink
// into a directory beside them (EOPNOTSUPP). Each checkpoint fails before
// the pause, with and without --leave-running, naming the directory and the
// reason, leaves no snapshot and no image (a snapshot directory it
// created is removed, an empty one the caller made stays), and both
// sources run on.
func TestFilestoreSnapshotDirWithoutReflink(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) *layerEnv
		// snapDir is where the snapshot directories go.
		snapDir func(t *testing.T, e *layerEnv) string
		errno   string
	}{
		{
			name:    "another-filesystem",
			env:     func(t *testing.T) *layerEnv { return newLayerEnv(t, 16) },
			snapDir: func(t *testing.T, e *layerEnv) string { return t.TempDir() }, // the host's root, not the XFS
			errno:   "invalid cross-device link",
		},
		{
			// tmpfs has no reflink, whatever the host's disks are.
			name:    "no-reflink",
			env:     func(t *testing.T) *layerEnv { return newLayerEnvIn(t, 16, smallFS(t, "256m")) },
			snapDir: func(t *testing.T, e *layerEnv) string { return e.dir },
			errno:   "operation not supported",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env(t)
			ids := []string{"leave-running", "plain"}
			outs := map[string]string{}
			for _, id := range ids {
				outs[id] = e.start(t, id)
			}
			for _, id := range ids {
				// runsc's own message names snap, not only the command
				// line that the error quotes.
				snap := filepath.Join(tc.snapDir(t, e), id+"-snap")
				if id == "plain" {
					// An empty directory of the caller's: it must stay.
					if err := os.Mkdir(snap, 0o755); err != nil {
						t.Fatal(err)
					}
				}
				e.parkFails(t, id, snap, "reflink", tc.errno, "snapshots into "+snap)
			}
			// The failure came before the pause: even the plain
			// checkpoint left its source running with its layer and heap.
			for _, id := range ids {
				fullCheck(t, outs[id], 16)
			}
		})
	}
}

// parkFails checkpoints id (with --leave-running if id is
// "leave-running") into a new image directory with its filestore snapshots
// in snap, and checks that the checkpoint fails with an error containing
// each of want, leaving no image directory and snap as it was: empty if it
// existed, absent if not.
func (e *layerEnv) parkFails(t *testing.T, id, snap string, want ...string) {
	t.Helper()
	var extra []string
	if id == "leave-running" {
		extra = []string{"--leave-running"}
	}
	e.parkFailsFlags(t, id, snap, extra, want...)
}

// parkFailsFlags is parkFails with the checkpoint's extra flags given.
func (e *layerEnv) parkFailsFlags(t *testing.T, id, snap string, extra []string, want ...string) {
	t.Helper()
	image := filepath.Join(t.TempDir(), "image")
	_, err := os.Stat(snap)
	snapExisted := err == nil
	flags := append([]string{"--skip-filestore-pages", "--filestore-snapshot-dir=" + snap}, extra...)
	err = e.r.Checkpoint(id, image, flags...)
	if err == nil {
		t.Fatalf("%s: checkpoint into %s succeeded", id, snap)
	}
	t.Logf("%s: checkpoint: %v", id, err)
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: checkpoint error %q; want it to contain %q", id, err, w)
		}
	}
	switch entries, err := os.ReadDir(snap); {
	case snapExisted && err != nil:
		t.Errorf("%s: the failed checkpoint removed or broke the snapshot directory %s that existed before: %v", id, snap, err)
	case snapExisted && len(entries) != 0:
		t.Errorf("%s: the failed checkpoint left %d files in %s", id, len(entries), snap)
	case !snapExisted && !os.IsNotExist(err):
		t.Errorf("%s: the failed checkpoint left the snapshot directory %s that it created (%d entries, %v)", id, snap, len(entries), err)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Errorf("%s: the failed checkpoint left its image directory %s (%v)", id, image, err)
	}
}

// TestFilestoreRefusals checks every refusal: each gives its error, starts
// nothing and leaves the artifacts byte-identical.
func TestFilestoreRefusals(t *testing.T) {
	e := newLayerEnv(t, 16)
	e.start(t, "source")
	image, snap := e.park(t, "source", "p")
	e.r.Destroy("source")
	// Another checkpoint of the same workload: same layer size, other set.
	e.start(t, "other")
	otherImage, otherSnap := e.park(t, "other", "q")
	e.r.Destroy("other")
	imageSums, snapSums := dirSums(t, image), dirSums(t, snap)
	// Image p with the image marker of q: the state file still names p's set.
	swappedMarker := filepath.Join(e.dir, "swapped-marker-image")
	if out, err := exec.Command("cp", "-a", "--reflink=always", image, swappedMarker).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if out, err := exec.Command("cp", filepath.Join(otherImage, "filestores-external.json"), swappedMarker).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}

	variant := func(name string, mutate func(dir string)) string {
		dir := filepath.Join(e.dir, name)
		if out, err := exec.Command("cp", "-a", "--reflink=always", snap, dir).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		mutate(dir)
		return dir
	}
	// manifest rewrites filestores.json after edit, as runsc writes it
	// (runsc refuses other bytes: "manifest not as written" below).
	manifest := func(dir string, edit func(m *snapshotManifest)) {
		path := filepath.Join(dir, "filestores.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m snapshotManifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		edit(&m)
		b, _ = json.MarshalIndent(&m, "", "  ")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	noManifest := variant("nomanifest", func(d string) { os.Remove(filepath.Join(d, "filestores.json")) })
	undersized := variant("undersized", func(d string) { os.Truncate(filepath.Join(d, "filestore-0.img"), 1<<20) })
	tampered := variant("tampered", func(d string) { flipByteAt(t, filepath.Join(d, "filestore-0.img"), 0) })
	duplicated := variant("duplicated", func(d string) {
		manifest(d, func(m *snapshotManifest) { m.Filestores = append(m.Filestores, m.Filestores[0]) })
	})
	otherContainer := variant("othercontainer", func(d string) {
		manifest(d, func(m *snapshotManifest) { m.Filestores[0].ResourceContainer = "someone-else" })
	})
	missingEntry := variant("missingentry", func(d string) {
		manifest(d, func(m *snapshotManifest) { m.Filestores[0].ResourcePath = "/elsewhere" })
	})
	// The same values, written compactly: refused as not runsc's bytes.
	compact := variant("compact", func(d string) {
		path := filepath.Join(d, "filestores.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	// Copies on the root filesystem (ext4 here), where reflink is impossible.
	noReflink := filepath.Join(t.TempDir(), "noreflink")
	if out, err := exec.Command("cp", "-a", "--sparse=always", snap, noReflink).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	var noReflinkFS unix.Statfs_t
	unix.Statfs(noReflink, &noReflinkFS)

	for _, tc := range []struct {
		name  string
		image string
		flags []string
		want  string
	}{
		{"not adopted", image, nil, "adopt its filestores with --filestore-adopt-dir"},
		{"manifest missing", image, []string{"--filestore-adopt-dir=" + noManifest}, "filestores.json: no such file"},
		{"undersized", image, []string{"--filestore-adopt-dir=" + undersized}, "want exactly"},
		{"fingerprint mismatch", image, []string{"--filestore-adopt-dir=" + tampered}, "does not match its manifest entry"},
		{"duplicated entry", image, []string{"--filestore-adopt-dir=" + duplicated}, "twice"},
		{"other container", image, []string{"--filestore-adopt-dir=" + otherContainer}, "belongs to container"},
		{"entry not the checkpoint's", image, []string{"--filestore-adopt-dir=" + missingEntry}, "differs from the checkpoint's record"},
		{"manifest not as written", image, []string{"--filestore-adopt-dir=" + compact}, "filestores.json is not as runsc writes it"},
		{"no reflink", image, []string{"--filestore-adopt-dir=" + noReflink}, "reflink"},
		{"snapshot of another checkpoint", image, []string{"--filestore-adopt-dir=" + otherSnap}, "but the checkpoint in " + image + " was taken with snapshot set"},
		{"image marker of another checkpoint", swappedMarker, []string{"--filestore-adopt-dir=" + otherSnap}, "they belong to different checkpoints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "no reflink" && noReflinkFS.Type == unix.XFS_SUPER_MAGIC {
				t.Skip("the temporary directory supports reflink")
			}
			id := "refused-" + strings.ReplaceAll(tc.name, " ", "-")
			err := e.r.Restore(e.bundle, id, tc.image, filepath.Join(e.dir, id+".out"), tc.flags...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: got %v, want an error containing %q", err, tc.want)
			}
			if out, _ := e.r.Exec("list", "-quiet"); strings.Contains(out, id) {
				t.Errorf("refused restore left container %s behind", id)
			}
		})
	}
	// --filestore-adopt-dir for a checkpoint that holds its pages.
	e.start(t, "plain")
	plainImage := filepath.Join(e.dir, "plain-image")
	if err := e.r.Checkpoint("plain", plainImage); err != nil {
		t.Fatal(err)
	}
	e.r.Destroy("plain")
	if err := e.r.Restore(e.bundle, "refused-plain", plainImage, filepath.Join(e.dir, "rp.out"), "--filestore-adopt-dir="+snap); err == nil || !strings.Contains(err.Error(), "nothing to adopt") {
		t.Errorf("adopting into a checkpoint with pages: got %v", err)
	}
	// --filestore-snapshot-dir without --skip-filestore-pages, and the
	// reverse (filestores do not outlive the sandbox, so an image without
	// their pages needs a snapshot).
	e.start(t, "another")
	if err := e.r.Checkpoint("another", filepath.Join(e.dir, "y-image"), "--skip-filestore-pages"); err == nil || !strings.Contains(err.Error(), "requires --filestore-snapshot-dir") {
		t.Errorf("--skip-filestore-pages alone: got %v", err)
	}
	if err := e.r.Checkpoint("another", filepath.Join(e.dir, "x-image"), "--filestore-snapshot-dir="+filepath.Join(e.dir, "x-snap")); err == nil || !strings.Contains(err.Error(), "requires --skip-filestore-pages") {
		t.Errorf("--filestore-snapshot-dir alone: got %v", err)
	}

	if got := dirSums(t, image); fmt.Sprint(got) != fmt.Sprint(imageSums) {
		t.Errorf("image changed by refused restores")
	}
	if got := dirSums(t, snap); fmt.Sprint(got) != fmt.Sprint(snapSums) {
		t.Errorf("snapshot changed by refused restores")
	}
	// The untouched snapshot still works.
	out, _ := e.adopt(t, "good", image, snap)
	fullCheck(t, out, 16)

	// The fingerprint samples the first page of each 2 MiB block: a change
	// in another page is not detected (an accident check, not a digest;
	// README). Adoption accepts it.
	unsampled := variant("unsampled", func(d string) { flipByteAt(t, filepath.Join(d, "filestore-0.img"), 4096) })
	if err := e.r.Restore(e.bundle, "unsampled", image, filepath.Join(e.dir, "unsampled.out"), "--filestore-adopt-dir="+unsampled); err != nil {
		t.Errorf("adopting a snapshot changed outside the fingerprint's samples: %v (if the fingerprint became a full digest, expect a refusal here and update the README)", err)
	}
	e.r.Destroy("unsampled")
}

// TestFilestoreKilledCheckpoint kills `runsc checkpoint` at several points:
// the snapshot directory is then either complete and adoptable, or refused.
func TestFilestoreKilledCheckpoint(t *testing.T) {
	e := newLayerEnv(t, 16)
	// Kill `runsc checkpoint` and the sandbox (sentry included) at points
	// spread over the checkpoint, from before it starts to after it ends.
	// Every round must end either complete (restores with the layer and the
	// heap intact) or refused; across the rounds both must happen, or the
	// test did not reach both sides of the commit point.
	var complete, refused int
	// The last round (-1) is not killed: it completes however slow the
	// machine, so that both outcomes are always reached.
	for i, delay := range []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 60 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, -1} {
		id := fmt.Sprintf("src%d", i)
		e.start(t, id)
		pid, err := e.r.SandboxPID(id)
		if err != nil {
			t.Fatal(err)
		}
		image, snap := filepath.Join(e.dir, id+"-image"), filepath.Join(e.dir, id+"-snap")
		cmd := e.r.Command("checkpoint", "--image-path", image, "--skip-filestore-pages", "--filestore-snapshot-dir="+snap, id)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if delay >= 0 {
			time.Sleep(delay)
			cmd.Process.Signal(syscall.SIGKILL)
			// The sentry, mid-save or not (if it is still the sandbox).
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), id) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		cmd.Wait()
		e.r.Destroy(id)

		restoreID := id + "-restored"
		out := filepath.Join(e.dir, restoreID+".out")
		err = e.r.Restore(e.bundle, restoreID, image, out, "--filestore-adopt-dir="+snap)
		if err != nil {
			refused++
			t.Logf("round %d (kill after %v): restore refused: %v", i, delay, err)
			if out, _ := e.r.Exec("list", "-quiet"); strings.Contains(out, restoreID) {
				t.Errorf("refused restore left %s behind", restoreID)
			}
			continue
		}
		complete++
		t.Logf("round %d (kill after %v; -1: not killed): snapshot complete, restored", i, delay)
		fullCheck(t, out, 16)
		e.r.Destroy(restoreID)
	}
	if complete == 0 || refused == 0 {
		t.Errorf("%d rounds completed and %d were refused; want both outcomes", complete, refused)
	}
}

// TestFilestoreWithSharedBase parks a sandbox with a memory base and a
// writable layer in one checkpoint command and fans it out: memory from the
// shared base, the layer adopted from the snapshot.
func TestFilestoreWithSharedBase(t *testing.T) {
	e := newLayerEnv(t, 32)
	srcOut := e.start(t, "source")
	srcMark := e.fileMark(t, "source", srcOut)
	image, snap := filepath.Join(e.dir, "image"), filepath.Join(e.dir, "snap")
	if err := e.r.Checkpoint("source", image, "--shared-base", "--skip-filestore-pages", "--filestore-snapshot-dir="+snap); err != nil {
		t.Fatal(err)
	}
	e.r.Destroy("source")
	last := lastTick(t, srcOut)
	for _, name := range []string{"base.img", "base.json", "filestores-external.json"} {
		if _, err := os.Stat(filepath.Join(image, name)); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := os.Stat(filepath.Join(image, "pages.img")); err != nil || st.Size() > 8<<20 {
		t.Errorf("pages.img: %v (%d bytes); want neither memory nor layer in it", err, st.Size())
	}
	for _, id := range []string{"clone0", "clone1"} {
		out, first := e.adopt(t, id, image, snap)
		if first.N != last.N+1 || first.FileMark != srcMark || !first.OK {
			t.Fatalf("%s: first tick %+v; want tick %d, heap ok, filemark %s", id, first, last.N+1, srcMark)
		}
		fullCheck(t, out, 32)
	}
}

// TestFilestoreParkRefusesOtherContainersLayers parks the root container of
// a sandbox that holds a second container with a writable layer of its own:
// runsc passes snapshot files for the root container's filestores only, so
// the checkpoint must be refused before the pause, with a message that says
// why, leaving no artifacts and both containers running.
func TestFilestoreParkRefusesOtherContainersLayers(t *testing.T) {
	e := newLayerEnv(t, 16)
	const pod = "pod"
	cri := func(kind string) map[string]string {
		return map[string]string{"io.kubernetes.cri.container-type": kind, "io.kubernetes.cri.sandbox-id": pod}
	}
	if err := sandbox.Annotate(e.bundle, cri("sandbox")); err != nil {
		t.Fatal(err)
	}
	podOut := e.start(t, pod)
	app := filepath.Join(e.dir, "app-bundle")
	if err := sandbox.NewBundle(app, tickBin, "-mib", "16", "-interval", "50ms", "-file", "/layer.bin", "-file-mib", "16"); err != nil {
		t.Fatal(err)
	}
	if err := sandbox.Annotate(app, cri("container")); err != nil {
		t.Fatal(err)
	}
	appOut := filepath.Join(e.dir, "app.out")
	t.Cleanup(func() { e.r.Destroy("app") })
	if _, err := e.r.RunUntilTick(app, "app", appOut, 2, func(tk sandbox.Tick) bool { return tk.File == "ok" }); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		extra []string
	}{{"plain", nil}, {"leave-running", []string{"--leave-running"}}} {
		e.parkFailsFlags(t, pod, filepath.Join(e.dir, tc.name+"-snap"), tc.extra, "the sandbox has 2 filestores but the checkpoint passed 1 snapshot files", "other containers of the sandbox are not supported")
	}
	// Refused before the pause: both containers run on, heap and layer
	// intact.
	fullCheck(t, podOut, 16)
	fullCheck(t, appOut, 16)
}
