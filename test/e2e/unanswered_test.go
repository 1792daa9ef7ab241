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
// saying so, remove nothing, finish the image from what was written and mark
// it refused, since runsc cannot tell a complete save from one cut short; a
// restore is refused, naming the mark. Once the sandbox's log shows that the
// save succeeded and the mark is removed, the image restores with its heap
// and layer intact. A plain checkpoint, a park with filestore snapshots and
// a --shared-base park each run once.
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
			e.r.LogDir, e.r.LogInfo = t.TempDir(), true
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
			refused := filepath.Join(image, "refused.txt")
			for _, want := range []string{"exited without replying", "nothing was removed", "runsc finished the image", "marked it refused (" + refused + ")", image} {
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
			err = e.r.Restore(e.bundle, "refused", image, filepath.Join(e.dir, "refused.out"), extra...)
			e.r.Destroy("refused")
			if err == nil || !strings.Contains(err.Error(), "is marked refused by "+refused) || !strings.Contains(err.Error(), "Save succeeded") {
				t.Errorf("restore of the unanswered save: %v; want a refusal naming %s", err, refused)
			}
			// What an operator checks before removing the mark: the
			// sandbox's own boot log (runsc's logs quote the line too).
			if !bootLogsContain(t, e.r.LogDir, "Save succeeded: exiting...") {
				t.Fatalf("no sandbox boot log in %s says that the save succeeded", e.r.LogDir)
			}
			if err := os.Remove(refused); err != nil {
				t.Fatal(err)
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

// bootLogsContain reports whether a sandbox's boot log (runsc's debug log of
// its boot command) under dir has a line that contains want.
func bootLogsContain(t *testing.T, dir, want string) bool {
	t.Helper()
	for _, f := range readLogs(t, dir) {
		if !strings.Contains(f.name, ".boot.") {
			continue
		}
		for _, l := range f.lines {
			if strings.Contains(l, want) {
				return true
			}
		}
	}
	return false
}
