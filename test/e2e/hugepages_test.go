package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/sentry/hostmm"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/prereq"
)

// thpDir holds the host's transparent huge page settings.
const thpDir = "/sys/kernel/mm/transparent_hugepage"

// thpSaved holds the host's settings while a test has changed them, as
// lines "NAME VALUE", so that the next test binary puts them back if this
// one was killed or timed out before its cleanups ran (restoreHostTHP).
// /run does not survive a reboot, nor need it.
const thpSaved = "/run/forkvisor-e2e-thp"

// restoreHostTHP puts back the settings saved in thpSaved, if any, and
// removes it. TestMain calls it before and after the tests.
func restoreHostTHP() error {
	b, err := os.ReadFile(thpSaved)
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, value, ok := strings.Cut(l, " ")
		if !ok || strings.ContainsAny(name, "/.") {
			return fmt.Errorf("%s: malformed line %q", thpSaved, l)
		}
		if err := os.WriteFile(filepath.Join(thpDir, name), []byte(value), 0); err != nil {
			return fmt.Errorf("putting back %s from %s: %w", name, thpSaved, err)
		}
	}
	return os.Remove(thpSaved)
}

// useHugePageHost sets shmem_enabled "advise" and defrag "never", the
// settings that `runsc --host-settings=adjust` writes on a host like this
// one (whose shmem_enabled is "never" and defrag "madvise"), with which
// runsc gives a sandbox's MemoryFile huge pages. The host's own settings go
// back when t ends, after the sandboxes that t starts later are gone
// (cleanups run last-in first-out), or, if the test binary dies first, when
// the next one starts (thpSaved). The settings are host-wide: the tests of
// this package run one at a time, and no other package of the module starts
// sandboxes.
func useHugePageHost(t *testing.T) {
	t.Helper()
	set := []struct{ name, value string }{{"shmem_enabled", "advise"}, {"defrag", "never"}}
	var saved strings.Builder
	for _, s := range set {
		old, err := hostmm.ReadTransparentHugepageEnum(s.name)
		if err != nil {
			prereq.Missing(t, "transparent huge pages: %v", err)
		}
		fmt.Fprintf(&saved, "%s %s\n", s.name, old)
	}
	if err := os.WriteFile(thpSaved, []byte(saved.String()), 0o600); err != nil {
		t.Fatalf("saving the host's huge page settings: %v", err)
	}
	t.Cleanup(func() {
		if err := restoreHostTHP(); err != nil {
			t.Error(err)
		}
	})
	for _, s := range set {
		path := filepath.Join(thpDir, s.name)
		if err := os.WriteFile(path, []byte(s.value), 0); err != nil {
			prereq.Missing(t, "cannot set %s to %q: %v", path, s.value, err)
		}
	}
}

// writeSetCopyRE matches the line that the sentry logs when it has copied a
// write set from the base (pgalloc.MemoryFile.readFromBase).
var writeSetCopyRE = regexp.MustCompile(`read (\d+) bytes of its write set into the MemoryFile, (\d+) of them into its mapping \((\d+) in whole 2 MiB windows advised for huge pages\)`)

// TestSharedBaseWriterClonesOnHugePageHost runs a writer's clones on a host
// set up as runsc recommends, where the MemoryFile has huge pages (patch
// 0037; REPRODUCE §2f): each clone stays correct; each clone that applies
// the write set reads most of it into whole advised 2 MiB windows of the
// MemoryFile's mapping, rather than sending it into small pages, and its
// sentry maps at least that much of the MemoryFile with huge pages; and the
// clones use no more memory than upstream's clones on the same host.
func TestSharedBaseWriterClonesOnHugePageHost(t *testing.T) {
	const mib, clones = 64, 3
	binary(t, "runsc")
	useHugePageHost(t)
	args := []string{"-write-pct", "30"}
	upstream := upstreamFleetPss(t, mib, clones, args...)

	p := parkSource(t, mib, args...)
	var ids []string
	for i := 0; i < clones; i++ {
		id := fmt.Sprintf("h%d", i)
		// Each restore logs into a directory of its own, so that its
		// write-set copy is found next to its sentry.
		p.r.LogDir = filepath.Join(p.dir, "logs-"+id)
		if err := os.MkdirAll(p.r.LogDir, 0o755); err != nil {
			t.Fatal(err)
		}
		out := p.restoreClone(t, id, p.image, p.lastTick)
		if i == 0 {
			waitWriteSet(t, p.r.WriteSetPath(p.image))
		}
		waitFullCheck(t, out, mib)
		ids = append(ids, id)
	}

	// The first clone learns the write set; the others apply it.
	for _, id := range ids[1:] {
		logs := filepath.Join(p.dir, "logs-"+id)
		lines := logLines(t, logs, "bytes of its write set into the MemoryFile")
		if len(lines) != 1 {
			t.Fatalf("clone %s: want one write-set copy in its logs, got %q (debug logs in %s)", id, lines, logs)
		}
		m := writeSetCopyRE.FindStringSubmatch(lines[0])
		if m == nil {
			t.Fatalf("clone %s: unexpected write-set copy line %q", id, lines[0])
		}
		copied, _ := strconv.ParseUint(m[1], 10, 64)
		intoMapping, _ := strconv.ParseUint(m[2], 10, 64)
		windows, _ := strconv.ParseUint(m[3], 10, 64)
		pid, err := p.r.SandboxPID(id)
		if err != nil {
			t.Fatal(err)
		}
		pmdKiB, err := memstat.FieldKiB(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "ShmemPmdMapped")
		if err != nil {
			t.Fatal(err)
		}
		pmdMapped := pmdKiB << 10
		t.Logf("clone %s: write-set copy of %d bytes, %d of them read into the mapping, %d in whole advised windows; its sentry maps %d bytes of shmem with huge pages", id, copied, intoMapping, windows, pmdMapped)
		if copied == 0 || windows < copied/2 || windows > intoMapping {
			t.Errorf("clone %s should read most of its write set into whole advised windows of the MemoryFile's mapping: read %d bytes, %d into the mapping, %d in whole windows (debug logs in %s)", id, copied, intoMapping, windows, logs)
		}
		if pmdMapped < windows {
			t.Errorf("clone %s's sentry maps %d bytes of shmem with huge pages, want at least the %d bytes its write-set copy read into whole advised windows (host: thp_file_alloc %d, thp_file_fallback %d in /proc/vmstat)", id, pmdMapped, windows, vmstat(t, "thp_file_alloc"), vmstat(t, "thp_file_fallback"))
		}
	}

	pss := fleetPss(t, p.r, ids)
	t.Logf("%d clones storing into 30%% of %d MiB on a huge-page host: total memory %.1f MiB, upstream %.1f MiB", clones, mib, pss, upstream)
	if pss > upstream*1.05 {
		t.Errorf("forkvisor clones use %.1f MiB, more than upstream's %.1f MiB", pss, upstream)
	}
}

// vmstat returns the counter name of /proc/vmstat (0 if absent).
func vmstat(t *testing.T, name string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == name {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			return n
		}
	}
	return 0
}
