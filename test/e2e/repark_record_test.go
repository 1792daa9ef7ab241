package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestSharedBaseReparkNeedsTheRestoredBase parks clones whose record of the
// base they were restored over (kept in runsc's state of the sandbox) is
// missing, as a runsc before patch 0039 leaves it, or names another base,
// which is what a checkpoint looks like whose sentry, taken over by its
// guest, names a base it was not restored over:
//   - without the record, a --shared-base checkpoint is refused before
//     anything is saved, and the clone runs on;
//   - with another base recorded, the checkpoint is refused once the sentry
//     has saved, with an error that says the image must not be used, and
//     the stored base is not linked into it; the image is marked refused,
//     and restore and `bases link` refuse it even after its empty base.img
//     is removed.
func TestSharedBaseReparkNeedsTheRestoredBase(t *testing.T) {
	p := parkSource(t, 16)
	bases := listBases(t, p)
	if len(bases) != 1 {
		t.Fatalf("the store lists %+v; want the one base", bases)
	}
	digest := strings.TrimPrefix(bases[0].Digest, "sha256:")

	out := p.restoreClone(t, "norecord", p.image, p.lastTick)
	editSandboxState(t, p.r, "norecord", func(sb map[string]any) {
		delete(sb, "restoreRecordsBase")
		delete(sb, "restoredSharedBase")
	})
	image := filepath.Join(p.dir, "norecord-image")
	err := p.r.Checkpoint("norecord", image, "--shared-base")
	if err == nil || !strings.Contains(err.Error(), "did not record which shared base") {
		t.Fatalf("--shared-base checkpoint of a clone without a record: %v; want a refusal saying the restore recorded no base", err)
	}
	if _, err := os.Stat(filepath.Join(image, "checkpoint.img")); !os.IsNotExist(err) {
		t.Errorf("the refused checkpoint wrote %s (%v)", filepath.Join(image, "checkpoint.img"), err)
	}
	from := len(sandbox.Lines(out))
	if _, _, err := sandbox.WaitTick(out, from, 30*time.Second, func(sandbox.Tick) bool { return true }); err != nil {
		t.Errorf("the clone whose checkpoint was refused does not tick on: %v", err)
	}
	p.r.Destroy("norecord")

	p.restoreClone(t, "other", p.image, p.lastTick)
	other := strings.Repeat("ab", 32)
	editSandboxState(t, p.r, "other", func(sb map[string]any) { sb["restoredSharedBase"] = other })
	image = filepath.Join(p.dir, "other-image")
	err = p.r.Checkpoint("other", image, "--shared-base")
	p.r.Destroy("other")
	if err == nil || !strings.Contains(err.Error(), "must not be used") || !strings.Contains(err.Error(), digest) || !strings.Contains(err.Error(), other) {
		t.Fatalf("--shared-base checkpoint of a clone recorded over sha256:%s that names sha256:%s: %v; want a refusal naming both that says the image must not be used", other, digest, err)
	}
	st1, err1 := os.Stat(p.r.StoredBase(bases[0].Digest))
	st2, err2 := os.Stat(filepath.Join(image, "base.img"))
	if err1 != nil {
		t.Fatal(err1)
	}
	if err2 == nil && os.SameFile(st1, st2) {
		t.Errorf("the refused checkpoint's base.img is a link of the stored base")
	}
	if got := listBases(t, p); len(got) != 1 || len(got[0].Users) != len(bases[0].Users) {
		t.Errorf("after the refusal the store lists %+v; want the one base with its users %v", got, bases[0].Users)
	}

	// The refused image stays refused, even without its empty base.img
	// (whose absence would otherwise send a restore to the store for the
	// base the checkpoint named).
	if err := os.Remove(filepath.Join(image, "base.img")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	refused := filepath.Join(image, "refused.txt")
	if _, err := os.Stat(refused); err != nil {
		t.Errorf("the refused image is not marked: %v", err)
	}
	err = p.r.Restore(p.bundle, "refused", image, filepath.Join(p.dir, "refused.out"))
	p.r.Destroy("refused")
	if err == nil || !strings.Contains(err.Error(), "is marked refused") || !strings.Contains(err.Error(), refused) {
		t.Errorf("restore of the refused image: %v; want a refusal naming %s", err, refused)
	}
	if out, err := p.r.Exec("bases", "link", "sha256:"+digest, image); err == nil || !strings.Contains(string(out), "is marked refused") {
		t.Errorf("bases link into the refused image: %v: %s; want a refusal", err, out)
	}
	if _, err := os.Stat(filepath.Join(image, "base.img")); !os.IsNotExist(err) {
		t.Errorf("after the refusals the refused image has a base.img (%v)", err)
	}
}

// editSandboxState rewrites the sandbox record in runsc r's state file of
// container id with edit.
func editSandboxState(t *testing.T, r *sandbox.Runsc, id string, edit func(sandbox map[string]any)) {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(r.Root, "*_sandbox:"+id+".state"))
	if len(matches) != 1 {
		t.Fatalf("state files of %s under %s: %v", id, r.Root, matches)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	sb, ok := st["sandbox"].(map[string]any)
	if !ok {
		t.Fatalf("%s has no sandbox record", matches[0])
	}
	edit(sb)
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(matches[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
}
