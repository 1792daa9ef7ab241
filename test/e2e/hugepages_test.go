package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/forkvisor/forkvisor/internal/prereq"
)

// thpDir holds the host's transparent huge page settings.
const thpDir = "/sys/kernel/mm/transparent_hugepage"

// selectedTHP returns the bracketed choice of the setting file name under
// thpDir (e.g. "never" from "always advise [never]").
func selectedTHP(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(thpDir, name))
	if err != nil {
		return "", err
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return "", fmt.Errorf("%s: no selected value in %q", filepath.Join(thpDir, name), strings.TrimSpace(s))
	}
	return s[i+1 : j], nil
}

// useHugePageHost sets the host's settings to those that `runsc
// --host-settings=adjust` writes (shmem_enabled "advise", defrag "never"),
// with which runsc gives a sandbox's MemoryFile huge pages, and puts the
// host's own back when t ends (after the sandboxes that t starts later are
// gone: cleanups run last-in first-out). The settings are host-wide; e2e
// tests run one at a time.
func useHugePageHost(t *testing.T) {
	t.Helper()
	set := []struct{ name, value string }{{"shmem_enabled", "advise"}, {"defrag", "never"}}
	for _, s := range set {
		old, err := selectedTHP(s.name)
		if err != nil {
			prereq.Missing(t, "transparent huge pages: %v", err)
		}
		path := filepath.Join(thpDir, s.name)
		if err := os.WriteFile(path, []byte(s.value), 0); err != nil {
			prereq.Missing(t, "cannot set %s to %q: %v", path, s.value, err)
		}
		t.Cleanup(func() {
			if err := os.WriteFile(path, []byte(old), 0); err != nil {
				t.Errorf("putting back %s %q: %v", path, old, err)
			}
		})
	}
}

// writeSetCopyRE matches the line that the sentry logs when it has copied a
// write set from the base (pgalloc.MemoryFile.readFromBase).
var writeSetCopyRE = regexp.MustCompile(`read (\d+) bytes of its write set into the MemoryFile, (\d+) of them into its mapping`)

// shmemHugePagesKiB returns /proc/meminfo's ShmemHugePages.
func shmemHugePagesKiB(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "ShmemHugePages:" {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("/proc/meminfo: %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatal("/proc/meminfo has no ShmemHugePages")
	return 0
}

// TestSharedBaseWriterClonesOnHugePageHost runs a writer's clones on a host
// set up as runsc recommends, where the MemoryFile has huge pages (patch
// 0037; REPRODUCE §2f): each clone stays correct, a clone that applies the
// write set copies it into huge pages (most of it read into the MemoryFile's
// mapping rather than sent into small pages, and the host's shmem huge pages
// grow by at least that much), and the clones use no more memory than
// upstream's clones on the same host.
func TestSharedBaseWriterClonesOnHugePageHost(t *testing.T) {
	const mib, clones = 64, 3
	useHugePageHost(t)
	args := []string{"-write-pct", "30"}
	upstream := upstreamFleetPss(t, mib, clones, args...)

	p := parkSource(t, mib, args...)
	logs := filepath.Join(p.dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	p.r.LogDir = logs
	hugeBefore := shmemHugePagesKiB(t)
	var ids []string
	for i := 0; i < clones; i++ {
		id := fmt.Sprintf("h%d", i)
		out := p.restoreClone(t, id, p.image, p.lastTick)
		if i == 0 {
			waitWriteSet(t, p.r.WriteSetPath(p.image))
		}
		waitFullCheck(t, out, mib)
		ids = append(ids, id)
	}

	var copied, intoMapping uint64
	for _, l := range logLines(t, logs, "bytes of its write set into the MemoryFile") {
		m := writeSetCopyRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("unexpected write-set copy line %q", l)
		}
		n, _ := strconv.ParseUint(m[1], 10, 64)
		mapped, _ := strconv.ParseUint(m[2], 10, 64)
		copied, intoMapping = max(copied, n), max(intoMapping, mapped)
	}
	t.Logf("largest write-set copy: %d bytes, %d of them into huge-page windows of the mapping", copied, intoMapping)
	if copied == 0 || intoMapping < copied/2 {
		t.Errorf("a clone applying the write set should copy most of it into the MemoryFile's huge-page windows: read %d bytes, %d into the mapping (debug logs in %s)", copied, intoMapping, logs)
	}
	var grown uint64
	if after := shmemHugePagesKiB(t); after > hugeBefore {
		grown = (after - hugeBefore) << 10
	}
	t.Logf("the host's shmem huge pages grew by %d bytes while the clones ran", grown)
	if grown < intoMapping {
		t.Errorf("the host's shmem huge pages grew by %d bytes while the clones ran, want at least the %d bytes copied into huge-page windows", grown, intoMapping)
	}

	pss := fleetPss(t, p.r, ids)
	t.Logf("%d clones storing into 30%% of %d MiB on a huge-page host: total memory %.1f MiB, upstream %.1f MiB", clones, mib, pss, upstream)
	if pss > upstream*1.05 {
		t.Errorf("forkvisor clones use %.1f MiB, more than upstream's %.1f MiB", pss, upstream)
	}
}
