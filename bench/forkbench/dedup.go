package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkvisor/forkvisor/internal/cgroupmem"
	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// DedupResult is one condition of the dedup scenario: a group of instances
// that each hold a payload, and the group's memory sampled over time.
type DedupResult struct {
	Condition  string `json:"condition"`
	Instances  int    `json:"instances"`
	PayloadMiB int    `json:"payload_mib"`
	// SameData is true if every instance holds the same bytes (false: the
	// control, every page unique).
	SameData bool `json:"same_data"`
	KSM      bool `json:"ksm"` // KSM was running (run=1) during sampling
	// TimesS and PssMiB are the samples: seconds since the group was ready,
	// total Pss of every process of the group.
	TimesS []float64 `json:"times_s"`
	PssMiB []float64 `json:"pss_mib"`
	// ChargedMiB are the same samples of what the kernel charged to the
	// group's memory cgroup (cgroupmem): what an orchestrator sees. Pages
	// are charged to whoever touched them first: a clone of a base is
	// not charged for the base's page cache, which the parked source
	// wrote outside the group.
	ChargedMiB []float64 `json:"charged_mib"`
	// DropS is the first time from which the group's Pss stays at least
	// 128 MiB below its first sample, or -1 if it never does.
	DropS float64 `json:"drop_s"`
	// DropChargedS is the same for ChargedMiB.
	DropChargedS float64 `json:"drop_charged_s"`
	// KsmdCPUMs is the CPU time ksmd spent while the group was sampled.
	KsmdCPUMs float64 `json:"ksmd_cpu_ms"`
	// PagesSharing is KSM's host-wide pages_sharing at the end of sampling.
	PagesSharing int64 `json:"ksm_pages_sharing"`
}

const ksmDir = "/sys/kernel/mm/ksm"

func readKSM(name string) int64 {
	b, err := os.ReadFile(filepath.Join(ksmDir, name))
	must(err)
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	must(err)
	return v
}

// setKSMRun writes run (0: stopped, 1: running, 2: stopped and unmerge
// everything) to KSM's control file.
func setKSMRun(run int64) error {
	return os.WriteFile(filepath.Join(ksmDir, "run"), []byte(fmt.Sprint(run)), 0o644)
}

// ksmdCPU returns the CPU time ksmd has used.
func ksmdCPU() time.Duration {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "ksmd" {
			continue
		}
		pid, _ := strconv.Atoi(e.Name())
		d, err := sandbox.ProcessCPU(pid)
		must(err)
		return d
	}
	fatalf("no ksmd thread (is KSM built into this kernel?)")
	return 0
}

// dedupGroup is a running group of instances whose memory can be measured
// and whose payloads checked.
type dedupGroup struct {
	pss    func() float64   // MiB
	cgroup *cgroupmem.Group // every instance's processes
	outs   []string         // tick output files
	close  func()
}

// newDedupCgroup returns the memory cgroup of a dedup condition's group.
func newDedupCgroup(name string) *cgroupmem.Group {
	cg, err := cgroupmem.New("dedup-" + name)
	must(err)
	addCleanup(func() { cg.Remove() })
	return cg
}

// sample measures g every interval for d and returns the samples: total
// Pss and the bytes charged to g's cgroup, in MiB.
func (g *dedupGroup) sample(d, interval time.Duration) (times, pss, charged []float64) {
	start := time.Now()
	for next := start; time.Since(start) < d; next = next.Add(interval) {
		time.Sleep(time.Until(next))
		times = append(times, time.Since(start).Seconds())
		pss = append(pss, g.pss())
		c, err := g.cgroup.Usage()
		must(err)
		charged = append(charged, float64(c)/(1<<20))
	}
	return times, pss, charged
}

// checks waits, for every instance, until it has checked its whole payload
// from now on; a bad checksum on the way fails the benchmark (WaitTick).
func (g *dedupGroup) checks(payloadMiB int) {
	for _, out := range g.outs {
		waitFullPass(out, payloadMiB, 4)
	}
}

// sandboxGroup starts n sandboxes of rt holding the payload: upstream's
// are started each on its own; forkvisor's are clones of one parked source
// (--shared-base), so they share the payload from their first instant.
func sandboxGroup(dir string, rt runtimeConfig, n, payloadMiB int) *dedupGroup {
	base := filepath.Join(dir, "dedup-"+rt.name)
	tickArgs := []string{"-mib", fmt.Sprint(payloadMiB), "-interval", "50ms"}
	g := &dedupGroup{cgroup: newDedupCgroup(rt.name)}
	var ids []string
	var r *sandbox.Runsc
	if rt.fork {
		// The source is parked outside the group, as a fleet's golden
		// sandbox would be; its clones run inside.
		p := parkTick(base, "dedup", rt, tickArgs...)
		r = p.r
		must(sandbox.SetCgroupsPath(p.bundle, g.cgroup.Path()))
		for i := 0; i < n; i++ {
			id, out := fmt.Sprintf("clone%d", i), filepath.Join(base, fmt.Sprintf("clone%d.out", i))
			_, _, err := r.RestoreFirstTick(p.bundle, id, p.image, out)
			must(err)
			ids, g.outs = append(ids, id), append(g.outs, out)
		}
	} else {
		r = &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root"), Upstream: true, LogDir: runtimeLogDir("dedup", rt)}
		addCleanup(r.Cleanup)
		bundle := filepath.Join(base, "bundle")
		must(sandbox.NewBundle(bundle, abs(*tickBin), tickArgs...))
		must(sandbox.SetCgroupsPath(bundle, g.cgroup.Path()))
		for i := 0; i < n; i++ {
			id, out := fmt.Sprintf("sandbox%d", i), filepath.Join(base, fmt.Sprintf("sandbox%d.out", i))
			_, err := r.RunUntilTick(bundle, id, out, 2, nil)
			must(err)
			ids, g.outs = append(ids, id), append(g.outs, out)
		}
	}
	g.pss = func() float64 {
		m, err := r.Memory(ids...)
		must(err)
		return float64(m.All.Total()) / 1024
	}
	g.close = func() {
		r.Cleanup()
		os.RemoveAll(base)
		must(g.cgroup.Remove())
	}
	return g
}

// processGroup starts n plain host processes (no sandbox) of the tick
// workload with their payload marked mergeable for KSM; with unique, each
// holds different bytes.
func processGroup(dir string, n, payloadMiB int, unique bool) *dedupGroup {
	base := filepath.Join(dir, fmt.Sprintf("dedup-ksm-%t", unique))
	must(os.MkdirAll(base, 0o755))
	g := &dedupGroup{cgroup: newDedupCgroup(fmt.Sprintf("ksm-unique-%t", unique))}
	var cmds []*exec.Cmd
	var pids []int
	kill := func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
	addCleanup(kill)
	for i := 0; i < n; i++ {
		out := filepath.Join(base, fmt.Sprintf("process%d.out", i))
		f, err := os.Create(out)
		must(err)
		seed := "0"
		if unique {
			seed = fmt.Sprint(i + 1)
		}
		// The shell that moves itself into the cgroup execs the workload:
		// c.Process.Pid is the workload's.
		c := g.cgroup.Command(abs(*tickBin), "-mib", fmt.Sprint(payloadMiB), "-interval", "50ms", "-ksm", "-seed", seed, "-ctl", filepath.Join(base, fmt.Sprintf("ctl%d", i)))
		c.Stdout, c.Stderr = f, f
		c.Env = []string{"GOGC=off"}
		must(c.Start())
		f.Close()
		cmds, pids, g.outs = append(cmds, c), append(pids, c.Process.Pid), append(g.outs, out)
		_, _, err = sandbox.WaitTick(out, 0, 60*time.Second, func(t sandbox.Tick) bool { return t.N >= 2 })
		must(err)
	}
	g.pss = func() float64 {
		u, err := memstat.Processes(pids)
		must(err)
		return float64(u.Pss) / 1024
	}
	g.close = func() {
		kill()
		os.RemoveAll(base)
		must(g.cgroup.Remove())
	}
	return g
}

// dropTime returns the first sample time from which pss stays at least
// drop below its first sample, or -1.
func dropTime(times, pss []float64, drop float64) float64 {
	at := -1.0
	for i := range pss {
		if pss[i] <= pss[0]-drop {
			if at < 0 {
				at = times[i]
			}
		} else {
			at = -1
		}
	}
	return at
}

// dedup measures how memory of a group of instances holding the same
// payload falls over time: upstream sandboxes (their memory is a memfd,
// which KSM cannot merge, so KSM is left running for them to show it),
// forkvisor clones of one base (shared from the start; KSM off), and plain
// processes whose payload KSM may merge (KSM running with the host's
// settings), with a control of plain processes holding unique payloads.
// KSM's previous run setting is restored afterwards.
func dedup(dir string, runtimes []runtimeConfig, n, payloadMiB int, d time.Duration) []DedupResult {
	if _, err := os.Stat(ksmDir); err != nil {
		fatalf("dedup: %v (the kernel has no KSM)", err)
	}
	prevRun := readKSM("run")
	restore := func() {
		// Only logged: this also runs among fatalf's clean-ups.
		if err := setKSMRun(prevRun); err != nil {
			fmt.Fprintf(os.Stderr, "forkbench: dedup: restoring %s/run to %d: %v\n", ksmDir, prevRun, err)
		}
	}
	addCleanup(restore)
	defer restore()

	conditions := []struct {
		name     string
		ksm      bool
		same     bool
		newGroup func() *dedupGroup
	}{
		{"upstream", true, true, func() *dedupGroup { return sandboxGroup(dir, runtimes[0], n, payloadMiB) }},
		{"forkvisor", false, true, func() *dedupGroup { return sandboxGroup(dir, runtimes[1], n, payloadMiB) }},
		{"ksm", true, true, func() *dedupGroup { return processGroup(dir, n, payloadMiB, false) }},
		{"ksm-unique", true, false, func() *dedupGroup { return processGroup(dir, n, payloadMiB, true) }},
	}
	var results []DedupResult
	for _, c := range conditions {
		fmt.Fprintf(os.Stderr, "forkbench: dedup, %s\n", c.name)
		// Nothing merged by an earlier condition survives: run=2 unmerges.
		must(setKSMRun(2))
		g := c.newGroup()
		// Ready once every instance has checked its whole payload, as
		// the clone scenarios wait before they measure: until then an
		// instance's memory is still being mapped in (it grows by tens
		// of MiB in the first seconds of a sandbox, upstream's and
		// forkvisor's alike).
		g.checks(payloadMiB)
		if c.ksm {
			must(setKSMRun(1))
		}
		cpu0 := ksmdCPU()
		times, pss, charged := g.sample(d, 50*time.Millisecond)
		res := DedupResult{
			Condition:    c.name,
			Instances:    n,
			PayloadMiB:   payloadMiB,
			SameData:     c.same,
			KSM:          c.ksm,
			TimesS:       times,
			PssMiB:       pss,
			ChargedMiB:   charged,
			DropS:        dropTime(times, pss, 128),
			DropChargedS: dropTime(times, charged, 128),
			KsmdCPUMs:    ms(ksmdCPU() - cpu0),
			PagesSharing: readKSM("pages_sharing"),
		}
		must(setKSMRun(2))
		// Every payload reads back intact after sampling (merging and
		// unmerging included).
		g.checks(payloadMiB)
		g.close()
		results = append(results, res)
	}
	return results
}

func printDedup(results []DedupResult) {
	if len(results) == 0 {
		return
	}
	r0 := results[0]
	fmt.Printf("\ndedup: %d instances x %d MiB payload, total Pss and cgroup-charged memory sampled every 50 ms for %.0f s after the group is ready\n", r0.Instances, r0.PayloadMiB, r0.TimesS[len(r0.TimesS)-1])
	fmt.Printf("(upstream's guest memory is a shared memfd mapping, which KSM cannot merge; sharing is KSM's host-wide pages_sharing;\n")
	fmt.Printf(" charged is the group's memory cgroup: a clone is not charged for the base's page cache, which its parked source wrote outside the group)\n")
	fmt.Printf("%-11s %5s %5s %10s %10s %10s %10s %12s %12s %10s %12s %10s\n", "condition", "same", "ksm", "start_MiB", "end_MiB", "min_MiB", "drop128_s", "charged_MiB", "charged_end", "drop_chg_s", "ksmd_cpu_ms", "sharing")
	drop := func(s float64) string {
		if s < 0 {
			return "never"
		}
		return fmt.Sprintf("%.2f", s)
	}
	for _, r := range results {
		lo := r.PssMiB[0]
		for _, v := range r.PssMiB {
			lo = min(lo, v)
		}
		fmt.Printf("%-11s %5t %5t %10.1f %10.1f %10.1f %10s %12.1f %12.1f %10s %12.0f %10d\n", r.Condition, r.SameData, r.KSM, r.PssMiB[0], r.PssMiB[len(r.PssMiB)-1], lo, drop(r.DropS),
			r.ChargedMiB[0], r.ChargedMiB[len(r.ChargedMiB)-1], drop(r.DropChargedS), r.KsmdCPUMs, r.PagesSharing)
	}
}
