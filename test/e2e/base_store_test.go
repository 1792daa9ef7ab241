package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// storedBase is one entry of `runsc bases list --format=json`.
type storedBase struct {
	Digest string   `json:"digest"`
	Links  int      `json:"links"`
	Users  []string `json:"users"`
}

func listBases(t *testing.T, p *parked) []storedBase {
	t.Helper()
	out, err := p.r.Exec("bases", "--format=json", "list")
	if err != nil {
		t.Fatal(err)
	}
	var bases []storedBase
	if err := json.Unmarshal([]byte(out), &bases); err != nil {
		t.Fatalf("bases list: %v: %s", err, out)
	}
	return bases
}

// TestBaseStore parks a sandbox into the node base store and checks what a
// node operator relies on: the image links the stored base, keeps working
// when its directory moves or loses its base.img, the store refuses to
// remove a base that an image or a running clone uses, collects it once
// unused, and refuses a stored base changed in place.
func TestBaseStore(t *testing.T) {
	p := parkSource(t, 32)
	bases := listBases(t, p)
	if len(bases) != 1 || bases[0].Links != 1 || len(bases[0].Users) != 1 {
		t.Fatalf("after one park the store lists %+v; want one base linked by one image", bases)
	}
	digest := bases[0].Digest
	stored := p.r.StoredBase(digest)
	st1, err1 := os.Stat(stored)
	st2, err2 := os.Stat(filepath.Join(p.image, "base.img"))
	if err1 != nil || err2 != nil || !os.SameFile(st1, st2) {
		t.Fatalf("image's base.img is not a link of the stored base (%v, %v)", err1, err2)
	}

	// The image directory moves: it still restores.
	moved := filepath.Join(p.dir, "moved-image")
	if err := os.Rename(p.image, moved); err != nil {
		t.Fatal(err)
	}
	p.restoreClone(t, "from-moved", moved, p.lastTick)
	p.r.Destroy("from-moved")

	// A copy without base.img finds the base in the store by digest.
	noBase := filepath.Join(p.dir, "nobase-image")
	if err := os.MkdirAll(noBase, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img", "base.json", "files.json"} {
		sparseCopy(t, filepath.Join(moved, name), filepath.Join(noBase, name))
	}
	p.restoreClone(t, "from-store", noBase, p.lastTick)
	p.r.Destroy("from-store")

	// In use: removal is refused, gc keeps it.
	if _, err := p.r.Exec("bases", "remove", digest); err == nil || !strings.Contains(err.Error(), "still used by 1 linked image") {
		t.Errorf("bases remove of a base in use: %v", err)
	}
	if out, err := p.r.Exec("bases", "--min-age=0", "gc"); err != nil || strings.Contains(out, "removed") {
		t.Errorf("bases gc removed a base in use: %q, %v", out, err)
	}
	if out, err := p.r.Exec("bases", "verify", digest); err != nil || !strings.Contains(out, "ok") {
		t.Errorf("bases verify: %q, %v", out, err)
	}

	// Changed in place (root can): the next restore refuses it.
	off := flipFirstDataByte(t, stored)
	err := p.r.Restore(p.bundle, "from-changed", moved, filepath.Join(p.dir, "changed.out"))
	if err == nil || !strings.Contains(err.Error(), "does not match the checkpoint") {
		t.Errorf("restore over a stored base changed in place: %v", err)
	}
	if _, err := p.r.Exec("bases", "verify", digest); err == nil || !strings.Contains(err.Error(), "it was changed") {
		t.Errorf("bases verify of a changed base: %v", err)
	}
	flipByteAt(t, stored, off)

	// A clone still runs over it once its images are gone: its next park
	// references the base, so neither remove nor gc takes it.
	p.restoreClone(t, "holder", noBase, p.lastTick)
	if err := os.RemoveAll(moved); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(noBase); err != nil {
		t.Fatal(err)
	}
	if _, err := p.r.Exec("bases", "remove", digest); err == nil || !strings.Contains(err.Error(), "mapped or held open by running processes") {
		t.Errorf("bases remove of a base a running clone maps: %v", err)
	}
	if out, err := p.r.Exec("bases", "--min-age=0", "gc"); err != nil || strings.Contains(out, "removed") {
		t.Errorf("bases gc removed a base a running clone maps: %q, %v", out, err)
	}
	p.r.Destroy("holder")

	// Unused once its images and clones are gone: gc removes it.
	out, err := p.r.Exec("bases", "--min-age=0", "gc")
	if err != nil || !strings.Contains(out, "removed "+digest) {
		t.Errorf("bases gc after the images were removed: %q, %v", out, err)
	}
	if bases := listBases(t, p); len(bases) != 0 {
		t.Errorf("store still lists %+v after gc", bases)
	}
	if _, err := os.Stat(stored); !os.IsNotExist(err) {
		t.Errorf("stored base still on disk after gc: %v", err)
	}
}
