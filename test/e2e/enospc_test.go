package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// smallFS mounts a tmpfs of size bytes at a new directory and returns it.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mounting a %s tmpfs: %v", size, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestCheckpointOutOfSpace parks a 64 MiB workload into an image directory
// on a filesystem too small for it: the checkpoint fails with an error that
// names the directory and the lack of space; the failed save leaves no
// checkpoint file (a directory the checkpoint created is removed, files that
// were there stay) and nothing new in the base store, and nothing restores
// from it. A --shared-base checkpoint is refused before the sandbox is
// paused (runsc compares the space with the sandbox's memory), so its source
// keeps running with or without --leave-running; a plain one fails in its
// save, after which the source keeps running with --leave-running, and
// exits without it, as upstream's does. A source that keeps running has its
// heap intact and can then be parked elsewhere and restored.
func TestCheckpointOutOfSpace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		// existing puts the image directory, holding another file, in
		// place before the checkpoint.
		existing bool
	}{
		{name: "shared base", flags: []string{"--shared-base"}},
		{name: "shared base, leave running", flags: []string{"--shared-base", "--leave-running"}},
		{name: "plain, into a directory that exists", existing: true},
		{name: "plain, leave running", flags: []string{"--leave-running"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := startSource(t, "runsc", 64)
			image := filepath.Join(smallFS(t, "16m"), "image")
			other := filepath.Join(image, "notes.txt")
			if tc.existing {
				if err := os.Mkdir(image, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(other, []byte("not the checkpoint's"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := src.r.Checkpoint("source", image, tc.flags...)
			if err == nil {
				t.Fatalf("checkpoint into a 16 MiB filesystem succeeded")
			}
			t.Logf("checkpoint: %v", err)
			ckptErr := err
			if msg := err.Error(); !strings.Contains(msg, "no space left on device") || !strings.Contains(msg, image) {
				t.Errorf("checkpoint error %q; want it to name %s and the lack of space", msg, image)
			}
			entries, err := os.ReadDir(image)
			switch {
			case tc.existing:
				if len(entries) != 1 || entries[0].Name() != "notes.txt" {
					t.Errorf("the image directory holds %v after the failed checkpoint (%v); want only the file that was there", entries, err)
				}
			case !os.IsNotExist(err):
				t.Errorf("the failed checkpoint left %s (%v, %d entries)", image, err, len(entries))
			}
			if entries, _ := os.ReadDir(filepath.Join(src.r.StorePath(), "sha256")); len(entries) != 0 {
				t.Errorf("the failed checkpoint left %d entries in the base store", len(entries))
			}
			if err := src.r.Restore(src.bundle, "from-failed", image, filepath.Join(src.dir, "ff.out")); err == nil {
				t.Errorf("restore from the failed checkpoint's directory succeeded")
			}
			sharedBase := slices.Contains(tc.flags, "--shared-base")
			if sharedBase && !strings.Contains(ckptErr.Error(), "bytes available") {
				t.Errorf("--shared-base checkpoint error %q; want the refusal before the pause, which says how many bytes are available", ckptErr)
			}
			if !slices.Contains(tc.flags, "--leave-running") && !sharedBase {
				return
			}
			// The source keeps running with its heap intact, and can be
			// parked where there is room.
			n := len(sandbox.Lines(src.out))
			if _, _, err := sandbox.WaitTick(src.out, n, 10*time.Second, func(sandbox.Tick) bool { return true }); err != nil {
				t.Fatalf("source after the failed checkpoint: %v", err)
			}
			p := src.park(t, filepath.Join(src.dir, "image"), tc.flags...)
			if _, _, err := p.r.RestoreFirstTick(p.bundle, "after-enospc", p.image, filepath.Join(src.dir, "after.out")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCheckpointFinishFailureKeepsImage makes a --shared-base checkpoint
// fail after the sandbox was saved, at two points: files.json cannot be
// written (before the base is published), or base.json cannot (after it
// went into the store); each by a directory that takes the file's temporary
// name. The sandbox has exited, so the image is its only copy: the error
// must say that it was saved and nothing was removed, the unfinished image
// must be refused by a restore, and the commands the error names must
// finish it, after which it restores intact.
func TestCheckpointFinishFailureKeepsImage(t *testing.T) {
	for _, tc := range []struct {
		name, blocked string
		// importBase: the base did not reach the store and must be
		// imported first.
		importBase bool
	}{
		{"files.json", ".files.json.tmp", true},
		{"base.json", ".base.json.tmp", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := startSource(t, "runsc", 32)
			image := filepath.Join(src.dir, "image")
			blocker := filepath.Join(image, tc.blocked)
			if err := os.MkdirAll(blocker, 0o755); err != nil {
				t.Fatal(err)
			}
			err := src.r.Checkpoint("source", image, "--shared-base")
			if err == nil {
				t.Fatalf("checkpoint succeeded although %s could not be written", tc.name)
			}
			msg := lastLine(err.Error())
			for _, want := range []string{"the sandbox was saved, but finishing its image failed", "nothing was removed", "runsc bases import sha256:", "runsc bases link sha256:"} {
				if !strings.Contains(msg, want) {
					t.Errorf("checkpoint error %q does not say %q", msg, want)
				}
			}
			digest := msg[strings.Index(msg, "runsc bases link ")+len("runsc bases link "):]
			digest = digest[:strings.IndexByte(digest, ' ')]
			last := lastTick(t, src.out).N
			src.r.Destroy("source")
			for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img", "base.img"} {
				if _, err := os.Stat(filepath.Join(image, name)); err != nil {
					t.Errorf("the failed checkpoint did not keep %s: %v", name, err)
				}
			}
			p := &parked{r: src.r, dir: src.dir, bundle: src.bundle, image: image, lastTick: last}
			if err := p.r.Restore(p.bundle, "unfinished", image, filepath.Join(p.dir, "unfinished.out")); err == nil {
				t.Fatal("an unfinished image was restored")
			} else {
				t.Logf("unfinished image refused: %v", lastLine(err.Error()))
			}
			if err := os.Remove(blocker); err != nil {
				t.Fatal(err)
			}
			if tc.importBase {
				base := filepath.Join(image, "base.img")
				if err := os.Chmod(base, 0o444); err != nil {
					t.Fatal(err)
				}
				if out, err := p.r.Exec("bases", "import", digest, base); err != nil {
					t.Fatalf("bases import: %v: %s", err, out)
				}
			}
			if out, err := p.r.Exec("bases", "link", digest, image); err != nil {
				t.Fatalf("bases link: %v: %s", err, out)
			}
			out := p.restoreClone(t, "finished", image, last)
			waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= last+32/4+1 })
		})
	}
}

// TestCheckpointResumeHookFailureKeepsImage checkpoints a running source
// with --leave-running and a save/restore binary (the tick workload with
// -exit-in-mode) that succeeds before the save and fails after the resume.
// The save itself completed, so the checkpoint must fail naming the step
// that failed and saying that the image was kept, keep and finish the image
// (for --shared-base, publish its base), and the source must keep running;
// the image then restores with its heap intact (the binary's restore step
// succeeds).
func TestCheckpointResumeHookFailureKeepsImage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		// kept: files a finished image holds.
		kept []string
	}{
		{"plain", nil, []string{"checkpoint.img", "pages_meta.img", "pages.img"}},
		{"shared base", []string{"--shared-base"}, []string{"checkpoint.img", "pages_meta.img", "pages.img", "base.img", "files.json", "base.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := startSource(t, "runsc", 32)
			image := filepath.Join(src.dir, "image")
			before := lastTick(t, src.out).N
			flags := append([]string{"--leave-running", "--save-restore-exec-argv", "/workload -exit 3 -exit-in-mode resume"}, tc.flags...)
			err := src.r.Checkpoint("source", image, flags...)
			if err == nil {
				t.Fatal("checkpoint succeeded although its save/restore binary failed after the resume")
			}
			msg := lastLine(err.Error())
			for _, want := range []string{"/workload exited with non-zero status", "the sandbox was saved and resumed", "the image in " + image + " is complete and was kept"} {
				if !strings.Contains(msg, want) {
					t.Errorf("checkpoint error %q does not say %q", msg, want)
				}
			}
			for _, name := range tc.kept {
				if _, err := os.Stat(filepath.Join(image, name)); err != nil {
					t.Errorf("the checkpoint did not keep %s: %v", name, err)
				}
			}
			n := len(sandbox.Lines(src.out))
			if _, _, err := sandbox.WaitTick(src.out, n, 10*time.Second, func(sandbox.Tick) bool { return true }); err != nil {
				t.Fatalf("source after the checkpoint: %v", err)
			}
			src.r.Destroy("source")
			out := filepath.Join(src.dir, "clone.out")
			tk, _, err := src.r.RestoreFirstTick(src.bundle, "clone", image, out)
			if err != nil {
				t.Fatal(err)
			}
			if tk.N <= before || !tk.OK {
				t.Fatalf("clone: first tick %d, heap ok %t; want a tick after %d with sum=ok", tk.N, tk.OK, before)
			}
			waitTick(t, out, 0, "a full heap check", func(k sandbox.Tick) bool { return k.N >= tk.N+32/4+1 })
		})
	}
}

// fillFS allocates every free block of the filesystem holding dir to a new
// file, until the filesystem answers ENOSPC, and returns a function that
// frees them again.
func fillFS(t *testing.T, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var off int64
	for chunk := int64(1 << 30); chunk >= 4096; {
		if err := unix.Fallocate(int(f.Fd()), 0, off, chunk); err != nil {
			if err != unix.ENOSPC {
				t.Fatalf("fallocate %s: %v", path, err)
			}
			chunk /= 2
			continue
		}
		off += chunk
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("filled %s: %d MiB allocated, %d blocks left", dir, off>>20, st.Bavail)
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

// fillInodes creates empty files in fill, a directory made beforehand (with
// the filesystem full, a new directory may already find no inode), until the
// filesystem has no inode left (ENOSPC), and returns a function that removes
// them.
func fillInodes(t *testing.T, fill string) (free func()) {
	t.Helper()
	n := 0
	for ; ; n++ {
		f, err := os.Create(filepath.Join(fill, fmt.Sprint(n)))
		if errors.Is(err, unix.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if n > 1<<20 {
			t.Fatalf("created %d files in %s without running out of space", n, fill)
		}
	}
	t.Logf("filled %s: %d more files until ENOSPC", fill, n)
	return func() {
		if err := os.RemoveAll(fill); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFilestoreSnapshotOutOfSpace parks sandboxes whose layer lives on a full
// filesystem, with the snapshot directory on it (where reflinks must go).
// With every data block taken, a snapshot still succeeds: a reflink shares
// the layer's blocks and needs none of its own. With the inodes gone too,
// the checkpoint fails before pausing the sandbox, with an error naming the
// snapshot directory and the lack of space; it leaves no image and no
// snapshot file, and the source keeps running, with or without
// --leave-running. Once there is room again, both snapshots (the one taken
// on the full filesystem and a new park of a source that kept running) are
// adopted with layer and heap intact.
func TestFilestoreSnapshotOutOfSpace(t *testing.T) {
	e := newLayerEnvOn(t, 16, 512<<20)
	ids := []string{"leave-running", "plain"}
	outs := map[string]string{}
	for _, id := range ids {
		outs[id] = e.start(t, id)
	}
	inodeFiller := filepath.Join(e.dir, "inode-filler")
	if err := os.Mkdir(inodeFiller, 0o755); err != nil {
		t.Fatal(err)
	}
	freeBlocks := fillFS(t, e.dir)
	fullImage, fullSnap := filepath.Join(t.TempDir(), "image"), filepath.Join(e.dir, "full-snap")
	if err := e.r.Checkpoint("leave-running", fullImage, "--skip-filestore-pages", "--filestore-snapshot-dir="+fullSnap, "--leave-running"); err != nil {
		t.Fatalf("snapshot with no free data block: %v; a reflink needs none", err)
	}
	freeInodes := fillInodes(t, inodeFiller)
	for _, id := range ids {
		snap := filepath.Join(e.dir, id+"-snap")
		e.parkFails(t, id, snap, "no space left on device", snap)
	}
	freeInodes()
	freeBlocks()
	// Both sources still run with their layer and heap: the failure came
	// before the pause, so even the plain checkpoint left its source as it
	// was. The one run with --leave-running parks now that there is room.
	for _, id := range ids {
		fullCheck(t, outs[id], 16)
	}
	image, snap := e.park(t, "leave-running", "after-enospc")
	e.r.Destroy("leave-running")
	for id, s := range map[string][2]string{"adopted-full": {fullImage, fullSnap}, "adopted-after": {image, snap}} {
		out, _ := e.adopt(t, id, s[0], s[1])
		fullCheck(t, out, 16)
	}
}

// TestBaseStoreOutOfSpace parks a sandbox whose node base store lives on a
// filesystem too small for its base: the sandbox is saved and its base
// published, so the checkpoint succeeds with the image keeping its own
// base.img (self-contained, as without a store), and the store is left
// empty. Clones restore from the image with their heap intact.
func TestBaseStoreOutOfSpace(t *testing.T) {
	src := startSource(t, "runsc", 64)
	src.r.BaseStore = smallFS(t, "16m")
	p := src.park(t, filepath.Join(src.dir, "image"), "--shared-base")
	st, err := os.Stat(filepath.Join(p.image, "base.img"))
	if err != nil {
		t.Fatalf("the image has no base.img of its own after the store could not take it: %v", err)
	}
	if st.Mode().Perm()&0o222 != 0 {
		t.Errorf("the image's base.img has mode %v; want it published read-only", st.Mode())
	}
	// Not a link of a stored file: the store really could not take it.
	if nlink := st.Sys().(*syscall.Stat_t).Nlink; nlink != 1 {
		t.Errorf("the image's base.img has %d links; want 1 (nothing stored)", nlink)
	}
	if n := countEntries(t, filepath.Join(p.r.StorePath(), "sha256")); n != 0 {
		t.Errorf("the full store holds %d entries after the park; want none", n)
	}
	for _, id := range []string{"c0", "c1"} {
		waitFullCheck(t, p.restoreClone(t, id, p.image, p.lastTick), 64)
	}
}
