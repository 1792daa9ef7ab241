package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSharedBaseRestoredSandboxCannotChangeBase checks what keeps a restored
// sandbox, and anyone else, from changing a shared base under the clones
// that map it:
//   - the descriptor of base.img that a clone's sandbox holds is on a
//     read-only mount, so that a sentry a guest took over could not make
//     the base writable or give it away (fchmod, fchown fail with EROFS);
//   - a restore refuses a base that is open for writing elsewhere;
//   - a restore refuses a bundle whose mounts reach the image directory,
//     the directory of base.img's link target or the stored base's entry
//     in the base store, before a sandbox starts.
func TestSharedBaseRestoredSandboxCannotChangeBase(t *testing.T) {
	p := parkSource(t, 16)
	base := filepath.Join(p.image, "base.img")
	before := fileSum(t, base)
	var want unix.Stat_t
	if err := unix.Stat(base, &want); err != nil {
		t.Fatal(err)
	}

	out := p.restoreClone(t, "clone", p.image, p.lastTick)
	pid, err := p.r.SandboxPID("clone")
	if err != nil {
		t.Fatal(err)
	}
	fds := baseDescriptors(t, pid, &want)
	if len(fds) == 0 {
		t.Fatalf("sandbox process %d holds no descriptor of %s", pid, base)
	}
	for _, fd := range fds {
		f, err := os.Open(fd)
		if err != nil {
			t.Fatal(err)
		}
		errChmod := unix.Fchmod(int(f.Fd()), 0o666)
		errChown := unix.Fchown(int(f.Fd()), 1000, 1000)
		f.Close()
		if !errors.Is(errChmod, unix.EROFS) || !errors.Is(errChown, unix.EROFS) {
			os.Chmod(base, 0o444)
			os.Chown(base, 0, 0)
			t.Errorf("through the sandbox's descriptor %s of the base: fchmod: %v, fchown: %v; want EROFS for both (a read-only mount)", fd, errChmod, errChown)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(base, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o444 || st.Uid != 0 {
		t.Errorf("%s is mode %#o, uid %d after the attempts; want 0444, root", base, st.Mode&0o7777, st.Uid)
	}
	waitFullCheck(t, out, 16)
	p.r.Destroy("clone")

	// A base that something holds open for writing is refused.
	w, err := os.OpenFile(base, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = p.r.Restore(p.bundle, "writer", p.image, filepath.Join(p.dir, "writer.out"))
	w.Close()
	if err == nil {
		p.r.Destroy("writer")
		t.Fatalf("restore over a base open for writing succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, "open for writing elsewhere") || !strings.Contains(msg, base) {
		t.Errorf("restore over a base open for writing: %q; want it to name %s and say it is open for writing", msg, base)
	}

	// A bundle that mounts the image directory is refused before a
	// sandbox starts.
	reach := filepath.Join(p.dir, "bundle-reach")
	reachingBundle(t, p.bundle, reach, p.image)
	err = p.r.Restore(reach, "reach", p.image, filepath.Join(p.dir, "reach.out"))
	if err == nil {
		p.r.Destroy("reach")
		t.Fatalf("restore with the image directory mounted into the sandbox succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, "could open shared base") || !strings.Contains(msg, p.image) {
		t.Errorf("restore with the image directory mounted: %q; want it to name %s and say that the sandbox could reach it", msg, p.image)
	}
	if _, err := p.r.SandboxPID("reach"); err == nil {
		t.Errorf("the refused restore left sandbox %q", "reach")
	}
	// The same into a sandbox created beforehand (a warm pool's), which
	// is refused before the Restore RPC.
	if err := p.r.Create(reach, "reach-created", filepath.Join(p.dir, "reach-created.out")); err != nil {
		t.Fatal(err)
	}
	err = p.r.Restore(reach, "reach-created", p.image, filepath.Join(p.dir, "reach-created.out"))
	p.r.Destroy("reach-created")
	if err == nil || !strings.Contains(err.Error(), "could open shared base") {
		t.Errorf("restore into a created sandbox that mounts the image directory: %v; want a refusal saying that the sandbox could reach the base", err)
	}
	// A base.img that is a symbolic link: the directory of its target
	// counts.
	elsewhere := filepath.Join(p.dir, "elsewhere")
	linked := filepath.Join(p.dir, "image-link")
	for _, d := range []string{elsewhere, linked} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sparseCopy(t, base, filepath.Join(elsewhere, "base.img"))
	if err := os.Chmod(filepath.Join(elsewhere, "base.img"), 0o444); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img", "base.json", "files.json"} {
		sparseCopy(t, filepath.Join(p.image, name), filepath.Join(linked, name))
	}
	if err := os.Symlink(filepath.Join(elsewhere, "base.img"), filepath.Join(linked, "base.img")); err != nil {
		t.Fatal(err)
	}
	reachTarget := filepath.Join(p.dir, "bundle-reach-target")
	reachingBundle(t, p.bundle, reachTarget, elsewhere)
	err = p.r.Restore(reachTarget, "reach-target", linked, filepath.Join(p.dir, "reach-target.out"))
	if err == nil {
		p.r.Destroy("reach-target")
		t.Fatalf("restore with the directory of base.img's link target mounted into the sandbox succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, "could open shared base") || !strings.Contains(msg, elsewhere) {
		t.Errorf("restore with the link target's directory mounted: %q; want it to name %s and say that the sandbox could reach it", msg, elsewhere)
	}
	// A bundle that mounts a directory inside the base store, the stored
	// base's own entry, reaches the base as much as one that mounts the
	// store.
	bases := listBases(t, p)
	if len(bases) != 1 {
		t.Fatalf("the store lists %+v; want the one base", bases)
	}
	entry := filepath.Dir(p.r.StoredBase(bases[0].Digest))
	reachEntry := filepath.Join(p.dir, "bundle-reach-entry")
	reachingBundle(t, p.bundle, reachEntry, entry)
	err = p.r.Restore(reachEntry, "reach-entry", p.image, filepath.Join(p.dir, "reach-entry.out"))
	if err == nil {
		p.r.Destroy("reach-entry")
		t.Fatalf("restore with the stored base's store entry mounted into the sandbox succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, "could open shared base") || !strings.Contains(msg, entry) {
		t.Errorf("restore with the store entry mounted: %q; want it to name %s and say that the sandbox could reach it", msg, entry)
	}
	if fileSum(t, base) != before {
		t.Errorf("%s changed", base)
	}
	// The same image restores with the original bundle.
	p.restoreClone(t, "again", p.image, p.lastTick)
}

// baseDescriptors returns the /proc paths of process pid's descriptors of
// the file whose stat is want.
func baseDescriptors(t *testing.T, pid int, want *unix.Stat_t) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			continue // closed meanwhile
		}
		if st.Dev == want.Dev && st.Ino == want.Ino {
			fds = append(fds, path)
		}
	}
	return fds
}

// reachingBundle writes to dst a bundle like src (same root filesystem)
// that also bind-mounts dir, read-only, at /mnt.
func reachingBundle(t *testing.T, src, dst, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	spec["root"] = map[string]any{"path": filepath.Join(src, "rootfs"), "readonly": false}
	spec["mounts"] = append(spec["mounts"].([]any), map[string]any{"destination": "/mnt", "type": "bind", "source": dir, "options": []string{"rbind", "ro"}})
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}
