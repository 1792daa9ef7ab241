package e2e

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// parked is a source sandbox parked with --shared-base.
type parked struct {
	r        *sandbox.Runsc
	dir      string
	bundle   string
	image    string
	lastTick int
}

// parkSource runs the tick workload with a heap of mib MiB (and extra tick
// arguments args), waits for it to tick, and checkpoints it with
// --shared-base.
func parkSource(t *testing.T, mib int, args ...string) *parked {
	t.Helper()
	src := startSource(t, "runsc", mib, args...)
	return src.park(t, filepath.Join(src.dir, "image"), "--shared-base")
}

// restoreClone restores id from image (extra restore flags allowed), checks
// that its first tick continues from lastTick, and returns its output path.
func (p *parked) restoreClone(t *testing.T, id, image string, lastTick int, extra ...string) string {
	t.Helper()
	out := filepath.Join(p.dir, id+".out")
	tk, _, err := p.r.RestoreFirstTick(p.bundle, id, image, out, extra...)
	if err != nil {
		t.Fatal(err)
	}
	checkContinues(t, id, tk, lastTick)
	return out
}

// checkFirstTick waits for the first tick line of clone id in out and checks
// that it continues from lastTick with the heap intact.
func checkFirstTick(t *testing.T, id, out string, lastTick int) {
	t.Helper()
	tk, err := sandbox.WaitFirstTick(out, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	checkContinues(t, id, tk, lastTick)
}

// checkContinues checks that tk, the first tick of clone id, continues from
// lastTick with the heap intact.
func checkContinues(t *testing.T, id string, tk sandbox.Tick, lastTick int) {
	t.Helper()
	if tk.N != lastTick+1 || !tk.OK {
		t.Fatalf("clone %s: first tick %d, heap ok %t; want tick %d with sum=ok", id, tk.N, tk.OK, lastTick+1)
	}
}

// send runs `/workload -send cmd` in container id.
func (p *parked) send(t *testing.T, id, cmd string) {
	t.Helper()
	if _, err := p.r.Exec("exec", id, "/workload", "-send", cmd); err != nil {
		t.Fatal(err)
	}
}

// waitTick waits for a tick line of out at or after line index from that
// satisfies match, and fails the test on a line with sum=BAD.
func waitTick(t *testing.T, out string, from int, what string, match func(sandbox.Tick) bool) (sandbox.Tick, int) {
	t.Helper()
	tk, idx, err := sandbox.WaitTick(out, from, 60*time.Second, match)
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return tk, idx
}

// TestSharedBaseClones parks a 256 MiB workload with --shared-base and fans
// out 8 clones on systrap: each continues the tick counter with its heap
// intact, keeps a private random mark no sibling sees, forks with the base
// and its private writes visible in the child, survives the
// write-every-other-page extreme, and can be parked again as a delta that
// restores over the same base.
func TestSharedBaseClones(t *testing.T) {
	const mib, clones = 256, 8
	p := parkSource(t, mib)

	for _, name := range []string{"base.img", "base.json", "pages_meta.img", "checkpoint.img"} {
		if _, err := os.Stat(filepath.Join(p.image, name)); err != nil {
			t.Fatalf("image: %v", err)
		}
	}
	if st, _ := os.Stat(filepath.Join(p.image, "pages.img")); st == nil || st.Size() > 16<<20 {
		t.Fatalf("pages.img should hold only the delta against the base; stat: %v", st)
	}
	// The published base is read-only: a new inode the sentry never held.
	if st, err := os.Stat(filepath.Join(p.image, "base.img")); err != nil || st.Mode().Perm()&0o222 != 0 {
		t.Errorf("base.img: %v, mode %v; want read-only", err, st.Mode())
	}

	outs := make([]string, clones)
	for i := range outs {
		outs[i] = p.restoreClone(t, fmt.Sprintf("c%d", i), p.image, p.lastTick)
	}

	// Each clone writes its own random mark and keeps reading it.
	marks := map[string]int{}
	markOf := make([]string, clones)
	from := make([]int, clones)
	for i := range outs {
		p.send(t, fmt.Sprintf("c%d", i), "mark")
	}
	for i, out := range outs {
		tk, idx := waitTick(t, out, 0, "a mark", func(tk sandbox.Tick) bool { return tk.Mark != "" && tk.Mark != "0" })
		if j, dup := marks[tk.Mark]; dup {
			t.Fatalf("clones %d and %d print the same mark %s: a write leaked between clones", j, i, tk.Mark)
		}
		marks[tk.Mark] = i
		markOf[i] = tk.Mark
		from[i] = idx
	}

	// fork() in clone 0: the child sees the base pattern and the mark.
	p.send(t, "c0", "fork")
	line, _, err := sandbox.WaitForLine(outs[0], from[0], 30*time.Second, func(l string) bool { return strings.HasPrefix(l, "forkchild") })
	if err != nil {
		t.Fatal(err)
	}
	if want := "forkchild sum=ok mark=" + markOf[0]; line != want {
		t.Errorf("fork child printed %q, want %q", line, want)
	}

	// The write-every-other-page extreme in clone 2.
	p.send(t, "c2", "scribble")
	if _, _, err := sandbox.WaitForLine(outs[2], from[2], 30*time.Second, func(l string) bool { return l == "scribbled" }); err != nil {
		t.Fatal(err)
	}

	// Every clone keeps its mark and an intact heap for a full pass of the
	// checksum over the heap (4 MiB per tick).
	for i, out := range outs {
		first, _ := sandbox.ParseTick(sandbox.Lines(out)[from[i]])
		tk, _ := waitTick(t, out, from[i], "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= first.N+mib/4+2 })
		if tk.Mark != markOf[i] {
			t.Errorf("clone %d: mark changed from %s to %s", i, markOf[i], tk.Mark)
		}
	}

	// Park clone 1 again: a delta-only image that references the base.
	image2 := filepath.Join(p.dir, "image2")
	if err := p.r.Checkpoint("c1", image2, "--shared-base"); err != nil {
		t.Fatal(err)
	}
	p.r.Destroy("c1")
	// Its base.img is a hard link of the stored base (the same inode as
	// the first image's), not a new base.
	st1, err1 := os.Stat(filepath.Join(p.image, "base.img"))
	st2, err2 := os.Stat(filepath.Join(image2, "base.img"))
	if err1 != nil || err2 != nil || !os.SameFile(st1, st2) {
		t.Errorf("re-parked clone's base.img is not the stored base (%v, %v): it must reference the existing base", err1, err2)
	}
	if st, err := os.Stat(filepath.Join(image2, "pages.img")); err != nil || st.Size() > 4<<20 {
		t.Errorf("re-parked clone's pages.img: %v (%d bytes); want only its own pages", err, st.Size())
	}
	last := lastTick(t, outs[1])

	// A clone cannot be saved into a single compressed file: the refusal
	// comes before the sandbox is paused, and the clone keeps running.
	if err := p.r.Checkpoint("c3", filepath.Join(p.dir, "compressed"), "--compression=flate-best-speed"); err == nil || !strings.Contains(err.Error(), "--compression=none") {
		t.Errorf("compressed checkpoint of a clone: got %v, want a refusal", err)
	}
	n := len(sandbox.Lines(outs[3]))
	if _, _, err := sandbox.WaitForLine(outs[3], n, 10*time.Second, sandbox.IsTick); err != nil {
		t.Errorf("clone 3 stopped after a refused checkpoint: %v", err)
	}

	// A plain checkpoint of a clone would silently depend on the base: it
	// is refused before the clone is paused, naming --shared-base.
	if err := p.r.Checkpoint("c3", filepath.Join(p.dir, "plain")); err == nil || !strings.Contains(err.Error(), "--shared-base") {
		t.Errorf("plain checkpoint of a clone: got %v, want a refusal naming --shared-base", err)
	}
	n = len(sandbox.Lines(outs[3]))
	if _, _, err := sandbox.WaitForLine(outs[3], n, 10*time.Second, sandbox.IsTick); err != nil {
		t.Errorf("clone 3 stopped after a refused plain checkpoint: %v", err)
	}

	out := p.restoreClone(t, "c1again", image2, last.N)
	tk, _ := waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= last.N+mib/4+2 })
	if tk.Mark != markOf[1] {
		t.Errorf("re-parked clone lost its mark: %s, want %s", tk.Mark, markOf[1])
	}
}

// TestSharedBaseRefusesReachableImageDir: a --shared-base checkpoint into a
// directory inside the container's root filesystem (which the sandbox, and
// every clone restored with the same bundle, could open by a path), or with
// a base store there that the park would create, is refused before the
// sandbox is paused, naming the directory and the path
// through which it is reachable; the sandbox keeps running without
// --leave-running, and nothing of the checkpoint is left.
func TestSharedBaseRefusesReachableImageDir(t *testing.T) {
	src := startSource(t, "runsc", 16)
	image := filepath.Join(src.bundle, "rootfs", "ckpt")
	err := src.r.Checkpoint("source", image, "--shared-base")
	if err == nil {
		t.Fatalf("checkpoint --shared-base into the container's root filesystem succeeded")
	}
	t.Logf("checkpoint: %v", err)
	if msg := err.Error(); !strings.Contains(msg, "could open the shared base by a path") || !strings.Contains(msg, image) {
		t.Errorf("checkpoint error %q; want it to name %s and say that the sandbox could reach it", msg, image)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Errorf("the refused checkpoint left %s (%v)", image, err)
	}
	// The same for a base store inside the root filesystem that the first
	// park on the node would create.
	store, outside := src.r.BaseStore, filepath.Join(src.dir, "outside")
	src.r.BaseStore = filepath.Join(src.bundle, "rootfs", "var", "bases")
	err = src.r.Checkpoint("source", outside, "--shared-base")
	newStore := src.r.BaseStore
	src.r.BaseStore = store
	if err == nil || !strings.Contains(err.Error(), "could open the shared base by a path") || !strings.Contains(err.Error(), newStore) {
		t.Errorf("checkpoint --shared-base with a base store to be created inside the container's root filesystem: %v; want a refusal naming %s", err, newStore)
	}
	for _, p := range []string{outside, newStore} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("the refused checkpoint left %s (%v)", p, err)
		}
	}
	n := len(sandbox.Lines(src.out))
	if _, _, err := sandbox.WaitTick(src.out, n, 10*time.Second, func(sandbox.Tick) bool { return true }); err != nil {
		t.Fatalf("source after the refused checkpoints: %v", err)
	}
	// Out of its reach, the same sandbox parks and restores.
	p := src.park(t, filepath.Join(src.dir, "image"), "--shared-base")
	if _, _, err := p.r.RestoreFirstTick(p.bundle, "clone", p.image, filepath.Join(src.dir, "clone.out")); err != nil {
		t.Fatal(err)
	}
}

// TestSharedBaseRefusesBadBase checks that a missing, truncated or different
// base is refused with a clear error before the sandbox starts, and that the
// base files are left as they were.
func TestSharedBaseRefusesBadBase(t *testing.T) {
	p := parkSource(t, 32)
	base := filepath.Join(p.image, "base.img")
	before := fileSum(t, base)

	// An image directory without its base.
	noBase := filepath.Join(p.dir, "nobase")
	if err := os.MkdirAll(noBase, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img", "base.json", "files.json"} {
		sparseCopy(t, filepath.Join(p.image, name), filepath.Join(noBase, name))
	}
	// copies returns the path of a copy of base.img, in its own directory
	// with a copy of base.json (the publish record), after mutate.
	copies := func(name string, mutate func(path string)) string {
		dir := filepath.Join(p.dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "base.img")
		sparseCopy(t, base, path)
		sparseCopy(t, filepath.Join(p.image, "base.json"), filepath.Join(dir, "base.json"))
		mutate(path)
		return path
	}
	st, err := os.Stat(base)
	if err != nil {
		t.Fatal(err)
	}
	truncated := copies("truncated", func(path string) {
		if err := os.Truncate(path, st.Size()/2); err != nil {
			t.Fatal(err)
		}
	})
	// Same length, one byte of data changed.
	tampered := copies("tampered", func(path string) { flipFirstDataByte(t, path) })
	// What a checkpoint that died before publishing leaves: the file the
	// sentry wrote, writable, without a publish record.
	unpublished := copies("unpublished", func(path string) {
		os.Chmod(path, 0o644)
		os.Remove(filepath.Join(filepath.Dir(path), "base.json"))
	})
	writable := copies("writable", func(path string) { os.Chmod(path, 0o644) })
	noRecord := copies("norecord", func(path string) { os.Remove(filepath.Join(filepath.Dir(path), "base.json")) })
	notRoot := copies("notroot", func(path string) { os.Chown(path, 65534, 65534) })

	// A node whose base store does not hold the base either.
	emptyStore := *p.r
	emptyStore.BaseStore = filepath.Join(p.dir, "empty-store")
	for _, tc := range []struct {
		name, image string
		flags       []string
		want        string
	}{
		{"missing", noBase, nil, "nor is it in the base store"},
		{"truncated", p.image, []string{"--shared-base=" + truncated}, "bytes, but the checkpoint"},
		{"tampered", p.image, []string{"--shared-base=" + tampered}, "does not match the checkpoint"},
		{"named base missing", p.image, []string{"--shared-base=/nonexistent"}, "needs shared base"},
		{"unpublished", p.image, []string{"--shared-base=" + unpublished}, "was never published"},
		{"writable", p.image, []string{"--shared-base=" + writable}, "is writable"},
		{"no publish record", p.image, []string{"--shared-base=" + noRecord}, "has no publish record"},
		{"not root-owned", p.image, []string{"--shared-base=" + notRoot}, "owned by uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "refused-" + strings.ReplaceAll(tc.name, " ", "-")
			err := emptyStore.Restore(p.bundle, id, tc.image, filepath.Join(p.dir, id+".out"), tc.flags...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: got %v, want an error containing %q", err, tc.want)
			}
			if out, _ := p.r.Exec("list", "-quiet"); strings.Contains(out, id) {
				t.Errorf("refused restore left container %s behind", id)
			}
		})
	}
	if fileSum(t, base) != before {
		t.Errorf("base.img changed")
	}
	// The good base still works after the refusals.
	p.restoreClone(t, "good", p.image, p.lastTick)

	// The base is now verified and cached on this host. Changed in place
	// (root can), it must be hashed again and refused; changed back, it
	// is accepted again.
	off := flipFirstDataByte(t, base)
	err = p.r.Restore(p.bundle, "tampered-in-place", p.image, filepath.Join(p.dir, "tip.out"))
	if err == nil || !strings.Contains(err.Error(), "does not match the checkpoint") {
		t.Errorf("restore over a cached base changed in place: got %v, want a refusal", err)
	}
	flipByteAt(t, base, off)
	if fileSum(t, base) != before {
		t.Fatalf("base.img not restored")
	}
	p.restoreClone(t, "good-again", p.image, p.lastTick)
}

// sparseCopy copies src to dst keeping holes.
func sparseCopy(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp %s %s: %v: %s", src, dst, err, out)
	}
}

// flipFirstDataByte inverts the first non-zero byte of path and returns its
// offset.
func flipFirstDataByte(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for off := int64(0); ; off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		for i := 0; i < n; i++ {
			if buf[i] != 0 {
				flipByteAt(t, path, off+int64(i))
				return off + int64(i)
			}
		}
		if err != nil {
			t.Fatalf("%s: no non-zero byte (%v)", path, err)
		}
	}
}

// flipByteAt inverts the byte at off in path.
func flipByteAt(t *testing.T, path string, off int64) {
	t.Helper()
	xorByteAt(t, path, off, 0xff)
}

// xorByteAt flips the bits of mask in the byte at off in path, in place.
func xorByteAt(t *testing.T, path string, off int64, mask byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// fileSum returns the SHA-256 of path's content.
func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// TestSharedBaseLeaveRunning parks with --leave-running: the source keeps
// running, and a clone restored from the image continues from the
// checkpoint.
func TestSharedBaseLeaveRunning(t *testing.T) {
	src := startSource(t, "runsc", 32)
	r, dir, bundle, srcOut := src.r, src.dir, src.bundle, src.out

	// A combination that cannot work is refused, and the source is unharmed.
	if err := r.Checkpoint("source", filepath.Join(dir, "compressed"), "--shared-base", "--compression=flate-best-speed"); err == nil || !strings.Contains(err.Error(), "--shared-base requires --compression=none") {
		t.Errorf("--shared-base with compression: got %v, want a refusal", err)
	}

	image := filepath.Join(dir, "image")
	last := lastTick(t, srcOut)
	if err := r.Checkpoint("source", image, "--shared-base", "--leave-running"); err != nil {
		t.Fatal(err)
	}
	n := len(sandbox.Lines(srcOut))
	if _, _, err := sandbox.WaitForLine(srcOut, n, 10*time.Second, sandbox.IsTick); err != nil {
		t.Fatalf("source stopped ticking after checkpoint --leave-running: %v", err)
	}
	// The clone continues from the tick the source was at when it was
	// saved: at least the last tick printed before the checkpoint started,
	// at most the source's tick once the checkpoint returned.
	lo := last.N
	hi := lastTick(t, srcOut).N
	out := filepath.Join(dir, "clone.out")
	first, _, err := r.RestoreFirstTick(bundle, "clone", image, out)
	if err != nil {
		t.Fatal(err)
	}
	if first.N < lo || first.N > hi+1 || !first.OK {
		t.Fatalf("clone's first tick %d (heap ok %t); want sum=ok and a tick in [%d, %d]", first.N, first.OK, lo, hi+1)
	}
	waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= first.N+32/4+2 })
}
