package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckpointKeepsAnUnansweredSave parks sandboxes that exit between
// their save and their reply (--TESTONLY-exit-after-save), as a sandbox
// that dies at that moment would: runsc gets no answer, and what the
// sandbox wrote may be the only copy of its state. The checkpoint must fail
// saying so, remove nothing, and finish the image from what was written,
// which then restores with its heap and layer intact. A plain checkpoint, a
// park with filestore snapshots and a --shared-base park each run once.
func TestCheckpointKeepsAnUnansweredSave(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags func(snap string) []string
		// files are what the image directory must hold after the failure.
		files []string
	}{
		{"plain", func(string) []string { return nil }, []string{"checkpoint.img", "pages_meta.img", "pages.img"}},
		{"filestore-snapshots", func(snap string) []string {
			return []string{"--skip-filestore-pages", "--filestore-snapshot-dir=" + snap}
		}, []string{"checkpoint.img", "pages_meta.img", "pages.img"}},
		{"shared-base", func(string) []string { return []string{"--shared-base"} }, []string{"checkpoint.img", "pages_meta.img", "pages.img", "base.img", "base.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLayerEnv(t, 16)
			e.r.Flags = []string{"--TESTONLY-exit-after-save"}
			e.start(t, "source")
			e.r.Flags = nil
			image, snap := filepath.Join(e.dir, "image"), filepath.Join(e.dir, "snap")
			flags := tc.flags(snap)
			err := e.r.Checkpoint("source", image, flags...)
			e.r.Destroy("source")
			if err == nil {
				t.Fatalf("checkpoint of a sandbox that exited before replying succeeded")
			}
			for _, want := range []string{"exited without replying", "nothing was removed", "runsc finished the image", image} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("checkpoint: %v; want it to say %q", err, want)
				}
			}
			for _, name := range tc.files {
				if _, err := os.Stat(filepath.Join(image, name)); err != nil {
					t.Errorf("after the unanswered save: %v", err)
				}
			}
			var extra []string
			if len(flags) > 0 && flags[0] == "--skip-filestore-pages" {
				extra = []string{"--filestore-adopt-dir=" + snap}
			}
			tk, _, err := e.r.RestoreFirstTick(e.bundle, "clone", image, filepath.Join(e.dir, "clone.out"), extra...)
			e.r.Destroy("clone")
			if err != nil {
				t.Fatalf("restore of the kept image: %v", err)
			}
			if !tk.OK || tk.File != "ok" {
				t.Errorf("clone's first tick: heap ok=%t, layer %s", tk.OK, tk.File)
			}
		})
	}
}
