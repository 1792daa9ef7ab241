package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRestoreReturnsFreedHeap restores a clone and requires its sentry to
// return to the host the heap that the restore freed (patch 0051): its boot
// log must say, within ten seconds of the restore's first tick, that it
// returned more than nothing. A restore that no longer schedules the
// release, or a release that returns nothing, fails.
func TestRestoreReturnsFreedHeap(t *testing.T) {
	src := startSource(t, "runsc", 64)
	src.r.LogDir = filepath.Join(src.dir, "logs")
	if err := os.MkdirAll(src.r.LogDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := src.park(t, filepath.Join(src.dir, "image"), "--shared-base")
	p.restoreClone(t, "clone", p.image, p.lastTick)
	defer p.r.Destroy("clone")
	const marker = " bytes of free heap to the host after the restore"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		for _, f := range readLogs(t, src.r.LogDir) {
			if !strings.Contains(f.name, ".boot.") {
				continue
			}
			for _, l := range f.lines {
				i := strings.Index(l, "Returned ")
				if i < 0 || !strings.Contains(l, marker) {
					continue
				}
				var n uint64
				if _, err := fmt.Sscanf(l[i:], "Returned %d", &n); err != nil {
					t.Fatalf("%s: cannot parse %q: %v", f.name, l, err)
				}
				if n == 0 {
					t.Fatalf("%s: the restored sandbox returned no heap to the host: %q", f.name, l)
				}
				t.Logf("%s: %s", f.name, l[i:])
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no boot log under %s says that the restored sandbox returned its freed heap to the host within 10s", src.r.LogDir)
		}
	}
}
