package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/prereq"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// fleetPss returns the total memory, in MiB, of every process (sentry,
// stubs, gofer; each address space once) of containers ids: their Pss and
// their MemoryFile pages that no process maps (memstat.Usage.Total).
func fleetPss(t *testing.T, r *sandbox.Runsc, ids []string) float64 {
	t.Helper()
	m, err := r.Memory(ids...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: total memory by kind (KiB): %v (of guest, no process maps %d)", filepath.Base(r.Bin), m.ByKind, m.All.Unmapped)
	return float64(m.All.Total()) / 1024
}

// waitFullCheck waits until the tick workload in out has checked its whole
// heap of mib MiB once (4 MiB per tick) with sum=ok.
func waitFullCheck(t *testing.T, out string, mib int) sandbox.Tick {
	t.Helper()
	first, _ := waitTick(t, out, 0, "a first tick", func(sandbox.Tick) bool { return true })
	tk, _ := waitTick(t, out, 0, "a full heap check", func(tk sandbox.Tick) bool { return tk.N >= first.N+mib/4+2 })
	return tk
}

// upstreamFleetPss parks the same workload with upstream runsc (plain
// checkpoint), restores n clones, and returns their total memory once each has
// checked its heap.
func upstreamFleetPss(t *testing.T, mib, n int, args ...string) float64 {
	t.Helper()
	src := startSource(t, "runsc-upstream", mib, args...)
	p := src.park(t, filepath.Join(src.dir, "image"))
	var ids []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("u%d", i)
		waitFullCheck(t, p.restoreClone(t, id, p.image, p.lastTick), mib)
		ids = append(ids, id)
	}
	pss := fleetPss(t, p.r, ids)
	for _, id := range ids {
		p.r.Destroy(id)
	}
	return pss
}

// TestSharedBaseReadersShareMemory asserts that clones of a read-mostly
// workload share the base: 4 clones of a 128 MiB heap, each having read its
// whole heap, must fit in one base plus a per-clone allowance far below a
// copy of the heap. A restore that silently copied the base (as upstream
// does) needs about 4 x 150 MiB and fails, and so does a first clone that
// keeps the speculative copy it learned its write set from.
func TestSharedBaseReadersShareMemory(t *testing.T) {
	const mib, clones, perCloneMiB = 128, 4, 48
	p := parkSource(t, mib)
	var ids []string
	for i := 0; i < clones; i++ {
		id := fmt.Sprintf("r%d", i)
		waitFullCheck(t, p.restoreClone(t, id, p.image, p.lastTick), mib)
		ids = append(ids, id)
	}
	pss := fleetPss(t, p.r, ids)
	bound := float64(mib + clones*perCloneMiB)
	t.Logf("%d read-mostly clones of %d MiB: total memory %.1f MiB (bound %.0f)", clones, mib, pss, bound)
	if pss > bound {
		t.Errorf("total memory of %d clones is %.1f MiB, above %.0f MiB (one %d MiB base + %d MiB per clone): the base is not shared", clones, pss, bound, mib, perCloneMiB)
	}
}

// TestSharedBaseWriterClones restores clones of workloads that store into
// 30% and 100% of their heap pages (scattered) on every tick, the first tick
// after restore included. Each clone must continue correctly; the first one
// learns the base's write set (kept in the node base store's entry), later
// ones apply it, and so does a clone of a clone parked again; and the clones
// together must not use more memory than upstream's clones of the same
// workload.
func TestSharedBaseWriterClones(t *testing.T) {
	const mib, clones = 64, 4
	// The 100% writer's clones touch all they populated whatever the
	// host (--TESTONLY-touch-restored-always), so that the touch itself is
	// checked where the policy would stop it; the 30% writer's clones
	// check the policy.
	for _, tc := range []struct {
		pct         int
		alwaysTouch bool
	}{{30, false}, {100, true}} {
		pct := tc.pct
		t.Run(fmt.Sprintf("write%d", pct), func(t *testing.T) {
			args := []string{"-write-pct", fmt.Sprint(pct)}
			upstream := upstreamFleetPss(t, mib, clones, args...)

			p := parkSource(t, mib, args...)
			if tc.alwaysTouch {
				p.r.Flags = append(p.r.Flags, "--TESTONLY-touch-restored-always")
			}
			logs := filepath.Join(p.dir, "logs")
			if err := os.MkdirAll(logs, 0o755); err != nil {
				t.Fatal(err)
			}
			p.r.LogDir = logs
			ws := p.r.WriteSetPath(p.image)
			var ids []string
			for i := 0; i < clones; i++ {
				id := fmt.Sprintf("w%d", i)
				out := p.restoreClone(t, id, p.image, p.lastTick)
				if i == 0 {
					// The first clone learns; wait for the set it writes.
					waitWriteSet(t, ws)
				}
				waitFullCheck(t, out, mib)
				ids = append(ids, id)
			}
			if !logsContain(t, logs, "learned a write set") || !logsContain(t, logs, "applying a write set") {
				t.Errorf("the first clone should learn the write set and later clones apply it (debug logs in %s)", logs)
			}
			// The learner copies the base while its kernel state loads, not
			// inside its faults, and gives back what it did not write.
			if !logsContain(t, logs, "of a speculative copy of the base") || !logsContain(t, logs, "of speculative copies in") {
				t.Errorf("the first clone should learn from a speculative copy of the base and give back what it did not write (debug logs in %s)", logs)
			}
			// Clones that apply the set have the page tables of what they
			// copied filled before they run (patch 0034), so that their
			// first stores do not fault page by page.
			if got, want := maxLogged(t, logs, populatedRE), uint64(mib*pct/100/2)<<20; got < want {
				t.Errorf("the most page table bytes a restore populated was %d, want at least %d (half of what each clone writes; debug logs in %s)", got, want, logs)
			}
			// A stub thread of each such clone then reads those pages
			// from user mode while the clone runs (patch 0045), unless it
			// finds that this does not pay, which it must say.
			checkTouches(t, logs, uint64(mib*pct/100/2)<<20, tc.alwaysTouch)
			pss := fleetPss(t, p.r, ids)
			t.Logf("%d clones storing into %d%% of %d MiB: total memory %.1f MiB, upstream %.1f MiB", clones, pct, mib, pss, upstream)
			if pss > upstream*1.05 {
				t.Errorf("forkvisor clones use %.1f MiB, more than upstream's %.1f MiB", pss, upstream)
			}

			// A clone parked again shares the base, and so its write set: a
			// restore of the new image applies it instead of learning again.
			image2 := filepath.Join(p.dir, "image-repark")
			if err := p.r.Checkpoint(ids[1], image2, "--shared-base"); err != nil {
				t.Fatal(err)
			}
			p.r.Destroy(ids[1])
			logs2 := filepath.Join(p.dir, "logs-repark")
			if err := os.MkdirAll(logs2, 0o755); err != nil {
				t.Fatal(err)
			}
			p.r.LogDir = logs2
			p.restoreClone(t, "w-repark", image2, lastTick(t, filepath.Join(p.dir, ids[1]+".out")).N)
			if !logsContain(t, logs2, "applying a write set") || logsContain(t, logs2, "Learning the write set") {
				t.Errorf("a restore of a re-parked clone should apply the base's write set, not learn one (debug logs in %s)", logs2)
			}
		})
	}
}

// waitWriteSet waits for a complete write set at path.
func waitWriteSet(t *testing.T, path string) {
	t.Helper()
	if err := sandbox.WaitWriteSet(path, 15*time.Second); err != nil {
		t.Fatal(err)
	}
}

// populatedRE and touchedRE match the lines that kernel.PopulateRestoredMemory
// and the user-mode touch that it starts log; touchFailedRE the touch's
// failure, and lateRE one whose piece passed its deadline, ended by the
// platform's interrupt (SIGCHLD, platform.SignalInterrupt) and nothing
// else; probeStopRE and idleStopRE the reasons the touch gives for
// stopping early.
var (
	populatedRE   = regexp.MustCompile(`Populated the page tables of (\d+) bytes of restored memory`)
	touchedRE     = regexp.MustCompile(`Touched (\d+) bytes of restored memory from user mode`)
	touchFailedRE = regexp.MustCompile(`Touching restored memory of MM .* from user mode: `)
	lateRE        = regexp.MustCompile(`: the switch ended with system call false, signal 17 at 0x[0-9a-f]+ \(deadline passed: true, interrupts: \d+\)$`)
	probeStopRE   = regexp.MustCompile(`; stopped: a page's first access cost (\S+) \(median of the probes \[([^]]*)\]\): cheap on this host$`)
	idleStopRE    = regexp.MustCompile(`; stopped: the tasks ran for (\S+), then none for (\S+)$`)
)

// checkTouches checks the user-mode touch of each restore, logged in its
// own file under dir, that populated at least want bytes: it touched at
// least want bytes, or, unless always, it stopped for a reason that the
// policy (kernel.touchStop) allows, after touching the five whole pieces of
// 64 pages that its probe needs. It fails if no restore populated that
// much, or if any touch failed, with one exception: one restore in dir may
// have stopped at a piece that passed its 50 ms deadline after touching
// those five pieces, which a stub thread that the host did not schedule in
// time causes on a loaded machine (the piece takes well under a
// millisecond otherwise), and the platform then stops touching, by design.
func checkTouches(t testing.TB, dir string, want uint64, always bool) {
	t.Helper()
	const probeBytes = 5 * 64 * 4096
	checked, late := 0, 0
	for _, f := range readLogs(t, dir) {
		var populated, touched uint64
		var touchLine string
		// failed are the restore's touch failures, one per MM at most.
		var failed []string
		for _, l := range f.lines {
			if m := populatedRE.FindStringSubmatch(l); m != nil {
				populated, _ = strconv.ParseUint(m[1], 10, 64)
			}
			if m := touchedRE.FindStringSubmatch(l); m != nil {
				touched, _ = strconv.ParseUint(m[1], 10, 64)
				touchLine = l
			}
			if touchFailedRE.MatchString(l) {
				failed = append(failed, l)
			}
		}
		if len(failed) > 0 {
			if len(failed) > 1 || !lateRE.MatchString(failed[0]) || touched < probeBytes || late > 0 {
				t.Errorf("%s: a restore's user-mode touch failed (%d bytes touched; earlier restores that stopped at their deadline: %d): %s", f.name, touched, late, strings.Join(failed, " | "))
				continue
			}
			late++
			t.Logf("%s: the touch stopped at a piece that passed its deadline, after %d bytes (a stub thread not scheduled in time; allowed once): %s", f.name, touched, failed[0])
			continue
		}
		if populated < want {
			continue
		}
		checked++
		t.Logf("%s: %s", f.name, touchLine)
		switch {
		case touchLine == "":
			t.Errorf("%s: a restore that populated %d bytes logged no user-mode touch", f.name, populated)
		case touched >= want && !strings.Contains(touchLine, "; stopped: "):
		case always:
			t.Errorf("%s: with --TESTONLY-touch-restored-always, a restore touched %d bytes, want at least %d and no stop: %q", f.name, touched, want, touchLine)
		case touched < probeBytes:
			t.Errorf("%s: the touch stopped after %d bytes, before its probe could decide: %q", f.name, touched, touchLine)
		default:
			if m := probeStopRE.FindStringSubmatch(touchLine); m != nil {
				median, err := time.ParseDuration(m[1])
				if n := len(strings.Fields(m[2])); err != nil || median >= time.Microsecond || n != 5 {
					t.Errorf("%s: the touch stopped on a probe median of %q (want below 1us) from %d probes (want 5): %q", f.name, m[1], n, touchLine)
				}
			} else if m := idleStopRE.FindStringSubmatch(touchLine); m != nil {
				ran, err1 := time.ParseDuration(m[1])
				idle, err2 := time.ParseDuration(m[2])
				if err1 != nil || err2 != nil || ran < 5*time.Millisecond || idle < 20*time.Millisecond {
					t.Errorf("%s: the touch stopped after the tasks ran %q and idled %q (want at least 5ms and 20ms): %q", f.name, m[1], m[2], touchLine)
				}
			} else {
				t.Errorf("%s: a restore touched %d bytes from user mode, want at least %d or a reason the policy allows: %q", f.name, touched, want, touchLine)
			}
		}
	}
	if checked == 0 {
		t.Errorf("no restore populated at least %d bytes (debug logs in %s)", want, dir)
	}
}

// maxLogged returns the largest number that re's first group matched in the
// runsc debug logs under dir (0 if re matched nothing).
func maxLogged(t *testing.T, dir string, re *regexp.Regexp) uint64 {
	t.Helper()
	var most uint64
	for _, l := range logLines(t, dir, "") {
		if m := re.FindStringSubmatch(l); m != nil {
			n, err := strconv.ParseUint(m[1], 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			most = max(most, n)
		}
	}
	return most
}

// stubMaps returns the largest number of host mappings of any process of the
// sandbox whose sentry is pid, other than the sentry (its systrap stubs).
func stubMaps(t *testing.T, pid int) int {
	t.Helper()
	most := 0
	for _, p := range memstat.Descendants(pid) {
		if p == pid {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p))
		if err != nil {
			continue // exited
		}
		most = max(most, bytes.Count(b, []byte("\n")))
	}
	return most
}

// TestSharedBaseCOWExtremes drives the copy-on-write policy to its extremes
// in one clone: every other page written (scribble), then one page per 2 MiB
// window (window1). The clone must stay correct and its stubs' host mappings
// stay bounded (the policy copies a window whole once it is fragmented).
func TestSharedBaseCOWExtremes(t *testing.T) {
	const mib = 64
	p := parkSource(t, mib)
	out := p.restoreClone(t, "x", p.image, p.lastTick)
	pid, err := p.r.SandboxPID("x")
	if err != nil {
		t.Fatal(err)
	}
	before := stubMaps(t, pid)
	for _, step := range []struct{ cmd, done string }{{"window1", "window1 done"}, {"scribble", "scribbled"}} {
		n := len(sandbox.Lines(out))
		p.send(t, "x", step.cmd)
		if _, _, err := sandbox.WaitForLine(out, n, 30*time.Second, func(l string) bool { return l == step.done }); err != nil {
			t.Fatal(err)
		}
		// 32 windows of 2 MiB, each at most ~18 fragments, plus what the
		// sandbox mapped before.
		if got, bound := stubMaps(t, pid), before+32*20; got > bound {
			t.Errorf("after %s: a stub has %d host mappings, more than %d", step.cmd, got, bound)
		}
	}
	waitFullCheck(t, out, mib)
}

// parkWriterWithLogs parks a shared-base source of mib MiB that stores into
// 30% of its heap pages each tick, and has its runsc write debug logs into
// the returned directory from then on.
func parkWriterWithLogs(t *testing.T, mib int) (*parked, string) {
	t.Helper()
	return parkWithLogs(t, mib, "-write-pct", "30")
}

// parkWithLogs parks a tick workload of mib MiB started with args and has
// its runsc write debug logs into the returned directory from then on.
func parkWithLogs(t *testing.T, mib int, args ...string) (*parked, string) {
	t.Helper()
	p := parkSource(t, mib, args...)
	logs := filepath.Join(p.dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	p.r.LogDir = logs
	return p, logs
}

// TestSharedBaseSurvivesStubENOMEM restores a writer's clone with systrap
// failing every 25th mmap and munmap of an application mapping with ENOMEM
// (--TESTONLY-systrap-enomem-every), as a stub at the host's
// vm.max_map_count would: the host limit itself is left alone, since it
// applies to every process on the machine. The sandbox drops the stub's
// application mappings and retries instead of failing the guest's access or
// panicking; the clone continues with an intact heap through writes to
// every other page and a fork. The flag also fails the first stack mapping
// of every new stub thread, which a guest at the limit reaches by making
// more threads runnable; without the retry there, the sentry panicked.
func TestSharedBaseSurvivesStubENOMEM(t *testing.T) {
	const mib = 64
	p, logs := parkWriterWithLogs(t, mib)
	p.r.Flags = append(p.r.Flags, "--TESTONLY-systrap-enomem-every=25")
	out := p.restoreClone(t, "x", p.image, p.lastTick)
	for _, step := range []struct{ cmd, done string }{{"scribble", "scribbled"}, {"fork", "forkchild sum=ok"}} {
		n := len(sandbox.Lines(out))
		p.send(t, "x", step.cmd)
		if _, _, err := sandbox.WaitForLine(out, n, 30*time.Second, func(l string) bool { return strings.HasPrefix(l, step.done) }); err != nil {
			t.Fatalf("%s: %v (the sandbox may have died; debug logs in %s)", step.cmd, err, logs)
		}
	}
	waitFullCheck(t, out, mib)
	for _, what := range []string{"refused an application mapping in address space", "refused a new stub thread's stack mapping in address space"} {
		if !logsContain(t, logs, what) {
			t.Fatalf("no ENOMEM fallback logged with %q: the injection did not run (debug logs in %s)", what, logs)
		}
	}
	// The log is rate-limited: its last count is a lower bound.
	most := 0
	count := regexp.MustCompile(`\((\d+) times in this sentry\)`)
	for _, l := range logLines(t, logs, " times in this sentry)") {
		for _, m := range count.FindAllStringSubmatch(l, -1) {
			n, _ := strconv.Atoi(m[1])
			most = max(most, n)
		}
	}
	t.Logf("the sentry logged at least %d ENOMEM fallbacks", most)
}

// TestSharedBaseExecBreaksCOW makes a page of a clone's base memory
// executable and runs it, with the base on a noexec filesystem: the base
// must never be mapped executable (that fails on noexec mounts and makes IMA
// measure the base); executing breaks copy-on-write like a write.
func TestSharedBaseExecBreaksCOW(t *testing.T) {
	src := startSource(t, "runsc", 16)
	noexec := filepath.Join(src.dir, "noexec")
	if err := os.MkdirAll(noexec, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", noexec, "tmpfs", unix.MS_NOEXEC, "size=256m"); err != nil {
		prereq.Missing(t, "mounting a noexec tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(noexec, unix.MNT_DETACH) })
	p := src.park(t, filepath.Join(noexec, "image"), "--shared-base")
	out := p.restoreClone(t, "x", p.image, p.lastTick)
	n := len(sandbox.Lines(out))
	p.send(t, "x", "exec")
	line, _, err := sandbox.WaitForLine(out, n, 30*time.Second, func(l string) bool { return strings.HasPrefix(l, "exec ") })
	if err != nil {
		t.Fatalf("no result from exec in the clone: %v (the sandbox may have died)", err)
	}
	if line != "exec ok" {
		t.Fatalf("exec in the clone: %q", line)
	}
	waitFullCheck(t, out, 16)
}

// TestSharedBaseParkWhileLearning parks the clone that learns the base's
// write set with --leave-running while it holds its speculative copy of the
// base (patch 0030), whose copies are given back only outside a
// checkpoint: once right after its first tick (running: still learning, see
// below), and once paused (`runsc pause`)
// right after it was restored with --paused and resumed (paused: learning
// starts at the resume and ends only after 250 ms without a new write,
// paused time not counted; the workload (tick -creep) writes one more 2 MiB
// window of its heap every 50 ms tick, so the learner sees new writes for
// 1.6 s after the resume and holds its copy during the park however long
// `runsc pause` takes to start; the park saves the copy's unchanged pages as
// base-backed). The clone keeps ticking with its heap intact and still
// writes the write set, and a clone of the new image continues from the
// parked tick with its heap intact.
func TestSharedBaseParkWhileLearning(t *testing.T) {
	for _, paused := range []bool{false, true} {
		t.Run(fmt.Sprintf("paused=%t", paused), func(t *testing.T) {
			const mib = 64
			p, logs := parkWithLogs(t, mib, "-creep")
			image2 := filepath.Join(p.dir, "image-learning")
			var out string
			var before, after int
			if !paused {
				out = p.restoreClone(t, "learner", p.image, p.lastTick)
				before = lastTick(t, out).N
				if err := p.r.Checkpoint("learner", image2, "--shared-base", "--leave-running"); err != nil {
					t.Fatal(err)
				}
				after = lastTick(t, out).N
			} else {
				out = filepath.Join(p.dir, "learner.out")
				if err := p.r.Restore(p.bundle, "learner", p.image, out, "--paused"); err != nil {
					t.Fatal(err)
				}
				if err := p.r.Resume("learner"); err != nil {
					t.Fatal(err)
				}
				if _, err := p.r.Exec("pause", "learner"); err != nil {
					t.Fatal(err)
				}
				if err := p.r.Checkpoint("learner", image2, "--shared-base", "--leave-running"); err != nil {
					t.Fatal(err)
				}
				// The learner held its copy through the park (it gives
				// the copy back only after 250 ms of unpaused quiet, or
				// once paused that long after the park), and the park
				// saved the copy's pages that still hold the base's bytes
				// as base-backed, not as the clone's own.
				if logsInOrder(t, logs, func(l string) bool { return strings.Contains(l, "of speculative copies in") }, "Sandbox save started") {
					t.Fatalf("the learner gave its copy back before the park (debug logs in %s)", logs)
				}
				st, err := os.Stat(filepath.Join(image2, "pages.img"))
				if err != nil {
					t.Fatal(err)
				}
				if st.Size() > mib<<20/8 {
					t.Fatalf("parking the paused learner saved %d bytes of pages; its %d MiB copy of the base should be saved as base-backed", st.Size(), mib)
				}
				if !p.r.Paused("learner") {
					t.Fatalf("parking the paused learner with --leave-running resumed it")
				}
				if err := p.r.Resume("learner"); err != nil {
					t.Fatal(err)
				}
				// The learner may have ticked between its resume and
				// its pause.
				before, after = p.lastTick, p.lastTick
				if len(sandbox.Lines(out)) != 0 {
					after = lastTick(t, out).N
				}
			}
			waitWriteSet(t, p.r.WriteSetPath(p.image))
			waitFullCheck(t, out, mib)
			if !logsContain(t, logs, "of a speculative copy of the base") || !logsContain(t, logs, "of speculative copies in") {
				t.Errorf("the learner should copy the base speculatively and give back what it did not write (debug logs in %s)", logs)
			}

			out2 := filepath.Join(p.dir, "clone.out")
			tk, _, err := p.r.RestoreFirstTick(p.bundle, "clone", image2, out2)
			if err != nil {
				t.Fatal(err)
			}
			// The park saved a tick between the ones printed before and
			// after it.
			if !tk.OK || tk.N <= before || tk.N > after+1 {
				t.Fatalf("clone of the learner parked between ticks %d and %d: first tick %d, heap ok %t", before, after, tk.N, tk.OK)
			}
			waitFullCheck(t, out2, mib)
		})
	}
}

// TestSharedBaseAttachedLearner restores the first clone of a base with an
// attached `runsc restore` (no --detach: the command lives as long as the
// container), which learns the base's write set. Once the set is written, a
// second restore must apply it (and seal it read-only) while the learner
// and its runsc still run: a runsc that kept its descriptor of the set open
// for writing would make every later restore refuse the set until the
// first clone exited.
func TestSharedBaseAttachedLearner(t *testing.T) {
	const mib = 64
	p := parkSource(t, mib, "-write-pct", "30")
	out := filepath.Join(p.dir, "learner.out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	learner := p.r.Command("restore", "--image-path", p.image, "--bundle", p.bundle, "learner")
	learner.Stdout, learner.Stderr = f, f
	if err := learner.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- learner.Wait() }()
	t.Cleanup(func() {
		p.r.Destroy("learner")
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			learner.Process.Kill()
		}
	})
	checkFirstTick(t, "learner", out, p.lastTick)
	path := p.r.WriteSetPath(p.image)
	waitWriteSet(t, path)
	// The learner's sentry closes the set just after writing it.
	waitNoWriters(t, path)
	select {
	case err := <-exited:
		t.Fatalf("the attached runsc restore exited (%v) while its container runs", err)
	default:
	}

	waitFullCheck(t, p.restoreClone(t, "clone", p.image, p.lastTick), mib)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o444 {
		t.Fatalf("write set %s has mode %v after a restore while the attached learner runs; want it applied and sealed read-only (0444)", path, st.Mode().Perm())
	}
}

// waitNoWriters waits up to 10 s until nothing holds the file at path open
// for writing: until the kernel grants a read lease on it (as runsc checks
// before it applies a write set).
func waitNoWriters(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_RDLCK)
		if err == nil {
			unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
			return
		}
		if err != unix.EAGAIN || time.Now().After(deadline) {
			t.Fatalf("%s is still open for writing somewhere (read lease: %v)", path, err)
		}
	}
}
