package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/warmpool"
)

// PrestartResult is one runtime's restore latency for a prestarted
// scenario: restore → first output of a clone of a parked workload, by a
// plain `runsc restore` (which creates the sandbox), into a sandbox created
// beforehand (internal/warmpool), and, for forkvisor, into a sandbox created
// beforehand whose `runsc restore --image-path-from` was started beforehand
// too (warmpool.NewPrespawned; upstream has no such flag), and by resuming a
// clone of the image restored paused beforehand (warmpool.NewRestored;
// upstream cannot restore without running the tasks), and the same with
// the clone's `runsc resume --wait-line-from` started beforehand too
// (warmpool.NewRestoredPrespawned).
type PrestartResult struct {
	Workload string `json:"workload"`
	Runtime  string `json:"runtime"`
	HeapMiB  int    `json:"heap_mib"`

	PlainMs      []float64 `json:"plain_ms"`
	PrestartedMs []float64 `json:"prestarted_ms"`
	// PrespawnedMs is from sending the image path to a waiting runsc
	// restore of a created sandbox to its first output (forkvisor only).
	PrespawnedMs []float64 `json:"prespawned_ms,omitempty"`
	// PrerestoredMs is from `runsc resume` of a paused clone to its first
	// output (forkvisor only).
	PrerestoredMs []float64 `json:"prerestored_ms,omitempty"`
	// PrespawnedResumeMs is from sending its line to a waiting runsc resume
	// of a paused clone to the clone's first output (forkvisor only).
	PrespawnedResumeMs []float64 `json:"prespawned_resume_ms,omitempty"`
	// CreateMs is what a waiting sandbox cost to create, off the restore
	// path (the pool creates it in the background).
	CreateMs []float64 `json:"create_ms"`

	PlainP50      float64 `json:"plain_p50_ms"`
	PlainP95      float64 `json:"plain_p95_ms"`
	PrestartedP50 float64 `json:"prestarted_p50_ms"`
	PrestartedP95 float64 `json:"prestarted_p95_ms"`
	CreateP50     float64 `json:"create_p50_ms"`
	// PrespawnedP50 and PrespawnedP95 are 0 for upstream.
	PrespawnedP50 float64 `json:"prespawned_p50_ms,omitempty"`
	PrespawnedP95 float64 `json:"prespawned_p95_ms,omitempty"`
	// PrerestoredP50 and PrerestoredP95 are 0 for upstream.
	PrerestoredP50 float64 `json:"prerestored_p50_ms,omitempty"`
	PrerestoredP95 float64 `json:"prerestored_p95_ms,omitempty"`
	// PrespawnedResumeP50 and PrespawnedResumeP95 are 0 for upstream.
	PrespawnedResumeP50 float64 `json:"prespawned_resume_p50_ms,omitempty"`
	PrespawnedResumeP95 float64 `json:"prespawned_resume_p95_ms,omitempty"`
}

// prestartWorkload is the workload of a prestarted scenario.
type prestartWorkload struct {
	name    string
	heapMiB int // 0 if the workload has no fixed heap
	// bundle writes the workload's bundle into dir.
	bundle func(dir string) error
}

// tickPrestart is the tick workload with a heap of heapMiB (scenario
// prestarted).
func tickPrestart(heapMiB int) prestartWorkload {
	return prestartWorkload{name: "tick", heapMiB: heapMiB, bundle: func(dir string) error {
		return sandbox.NewBundle(dir, abs(*tickBin), "-mib", fmt.Sprint(heapMiB), "-interval", "50ms", "-check-mib", "4")
	}}
}

// cpythonPrestart is the CPython agent of the cpython scenario (scenario
// prestarted-cpython).
func cpythonPrestart() prestartWorkload {
	for _, sc := range cloneScenarios {
		if sc.name == "cpython" {
			return prestartWorkload{name: "cpython", bundle: func(dir string) error { return pyAgentBundle(dir, sc.pyEntries) }}
		}
	}
	panic("no cpython clone scenario")
}

// prestarted runs a prestarted scenario for each runtime: -repeat runs of 8
// restores each way, alternating plain and prestarted; each clone is
// destroyed once it has printed.
func prestarted(dir string, runtimes []runtimeConfig, w prestartWorkload) []PrestartResult {
	const perRun = 8
	byRT := map[string]*PrestartResult{}
	for _, rt := range runtimes {
		byRT[rt.name] = &PrestartResult{Workload: w.name, Runtime: rt.name, HeapMiB: w.heapMiB}
	}
	for i := 0; i < *repeat; i++ {
		for _, rt := range runtimes {
			fmt.Fprintf(os.Stderr, "forkbench: prestarted %s, %s, run %d/%d\n", w.name, rt.name, i+1, *repeat)
			prestartRun(filepath.Join(dir, fmt.Sprintf("prestarted-%s-%s-%d", w.name, rt.name, i)), rt, w, perRun, byRT[rt.name])
		}
	}
	var out []PrestartResult
	for _, rt := range runtimes {
		r := byRT[rt.name]
		r.PlainP50, r.PlainP95 = median(r.PlainMs), percentile(r.PlainMs, 95)
		r.PrestartedP50, r.PrestartedP95 = median(r.PrestartedMs), percentile(r.PrestartedMs, 95)
		r.CreateP50 = median(r.CreateMs)
		if len(r.PrespawnedMs) > 0 {
			r.PrespawnedP50, r.PrespawnedP95 = median(r.PrespawnedMs), percentile(r.PrespawnedMs, 95)
		}
		if len(r.PrerestoredMs) > 0 {
			r.PrerestoredP50, r.PrerestoredP95 = median(r.PrerestoredMs), percentile(r.PrerestoredMs, 95)
		}
		if len(r.PrespawnedResumeMs) > 0 {
			r.PrespawnedResumeP50, r.PrespawnedResumeP95 = median(r.PrespawnedResumeMs), percentile(r.PrespawnedResumeMs, 95)
		}
		out = append(out, *r)
	}
	return out
}

func prestartRun(base string, rt runtimeConfig, w prestartWorkload, n int, res *PrestartResult) {
	r := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root"), Upstream: !rt.fork, LogDir: runtimeLogDir("prestarted", rt)}
	addCleanup(r.Cleanup)
	// Deferred in this order so that the sandboxes go before their root.
	defer os.RemoveAll(base)
	defer r.Cleanup()
	bundle := filepath.Join(base, "bundle")
	must(w.bundle(bundle))
	_, err := r.RunUntilTick(bundle, "source", filepath.Join(base, "source.out"), 2, nil)
	must(err)
	image := filepath.Join(base, "image")
	var flags []string
	if rt.fork {
		flags = append(flags, "--shared-base")
	}
	must(r.Checkpoint("source", image, flags...))
	r.Destroy("source")

	// A first restore, not counted: forkvisor learns the base's write set.
	learnWriteSet(r, rt, bundle, image, filepath.Join(base, "learner.out"))

	pool, err := warmpool.New(r, bundle, base, "warm", 1)
	must(err)
	defer pool.Close()
	var spawned, paused, resumers *warmpool.Pool
	if rt.fork {
		spawned, err = warmpool.NewPrespawned(r, bundle, base, "spawned", 1, rt.restoreArgs...)
		must(err)
		defer spawned.Close()
		paused, err = warmpool.NewRestored(r, bundle, image, base, "paused", 1, rt.restoreArgs...)
		must(err)
		defer paused.Close()
		resumers, err = warmpool.NewRestoredPrespawned(r, bundle, image, base, "resumer", 1, rt.restoreArgs...)
		must(err)
		defer resumers.Close()
	}
	// settle waits until every pool has refilled and the refills' new
	// processes have started, so that no refill runs while the next
	// measurement starts. (A pool refills
	// warmpool.RefillDelay after its request is served, when a tick clone
	// has printed its first line; the CPython agent's first output comes
	// later and still overlaps the refill.)
	settle := func() {
		must(pool.Fill(time.Minute))
		if spawned != nil {
			must(spawned.Fill(time.Minute))
		}
		if paused != nil {
			must(paused.Fill(time.Minute))
		}
		if resumers != nil {
			must(resumers.Fill(time.Minute))
		}
		// Fill returns once a refill's processes are started: a
		// prespawned runsc restore still initializes (tens of ms of
		// CPU) and a new sandbox loads its seccomp programs. Let that
		// end before the next measurement.
		time.Sleep(300 * time.Millisecond)
	}
	// fromPool measures a restore from p, start → first output, and
	// destroys the clone.
	fromPool := func(p *warmpool.Pool, extra ...string) float64 {
		settle()
		start := time.Now()
		s, err := p.Restore(image, extra...)
		must(err)
		if (p == spawned || p == resumers) && !s.Prespawned {
			fatalf("prestarted %s: %s was not served by its prespawned runsc process", rt.name, s.ID)
		}
		_, err = sandbox.WaitFirstTick(s.Out, start)
		must(err)
		took := ms(time.Since(start))
		r.Destroy(s.ID)
		return took
	}
	for i := 0; i < n; i++ {
		settle()
		id := fmt.Sprintf("plain%d", i)
		_, took, err := r.RestoreFirstTick(bundle, id, image, filepath.Join(base, id+".out"), rt.restoreArgs...)
		must(err)
		res.PlainMs = append(res.PlainMs, ms(took))
		r.Destroy(id)

		// What a waiting sandbox costs to create, off the restore path.
		cid := fmt.Sprintf("create%d", i)
		start := time.Now()
		must(r.Create(bundle, cid, filepath.Join(base, cid+".out")))
		res.CreateMs = append(res.CreateMs, ms(time.Since(start)))
		r.Destroy(cid)

		res.PrestartedMs = append(res.PrestartedMs, fromPool(pool, rt.restoreArgs...))
		if spawned != nil {
			res.PrespawnedMs = append(res.PrespawnedMs, fromPool(spawned))
		}
		if paused != nil {
			res.PrerestoredMs = append(res.PrerestoredMs, fromPool(paused))
		}
		if resumers != nil {
			res.PrespawnedResumeMs = append(res.PrespawnedResumeMs, fromPool(resumers))
		}
	}
}

// learnWriteSet restores a clone of image that is not measured and, for
// forkvisor, waits until it has learned the base's write set (the first
// restore of a base on a node does; a fleet learns once per base), then
// destroys it.
func learnWriteSet(r *sandbox.Runsc, rt runtimeConfig, bundle, image, out string) {
	_, _, err := r.RestoreFirstTick(bundle, "learner", image, out, rt.restoreArgs...)
	must(err)
	if rt.fork {
		if err := sandbox.WaitWriteSet(r.WriteSetPath(image), 15*time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "forkbench: %v\n", err)
		}
	}
	r.Destroy("learner")
}

// percentile returns the p-th percentile of v (nearest rank).
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func printPrestarted(results []PrestartResult) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\nprestarted: restore -> first output, %d samples each way per runtime; create_ms is the pool's work per sandbox, off the restore path\n", len(results[0].PlainMs))
	fmt.Printf("%-8s %-12s %5s %10s %10s %15s %15s %10s %15s %15s %16s %16s %21s %21s\n", "workload", "runtime", "heap", "plain_p50", "plain_p95", "prestarted_p50", "prestarted_p95", "create_ms", "prespawned_p50", "prespawned_p95", "prerestored_p50", "prerestored_p95", "prespawned_resume_p50", "prespawned_resume_p95")
	best := map[string]float64{} // upstream's best p50 per workload, either way
	orDash := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", v)
	}
	for _, r := range results {
		fmt.Printf("%-8s %-12s %5d %10.0f %10.0f %15.0f %15.0f %10.0f %15s %15s %16s %16s %21s %21s\n", r.Workload, r.Runtime, r.HeapMiB, r.PlainP50, r.PlainP95, r.PrestartedP50, r.PrestartedP95, r.CreateP50, orDash(r.PrespawnedP50), orDash(r.PrespawnedP95), orDash(r.PrerestoredP50), orDash(r.PrerestoredP95), orDash(r.PrespawnedResumeP50), orDash(r.PrespawnedResumeP95))
		if strings.HasPrefix(r.Runtime, "upstream") {
			if b, ok := best[r.Workload]; !ok || min(r.PlainP50, r.PrestartedP50) < b {
				best[r.Workload] = min(r.PlainP50, r.PrestartedP50)
			}
		}
	}
	for _, r := range results {
		if b := best[r.Workload]; !strings.HasPrefix(r.Runtime, "upstream") && b > 0 {
			fmt.Printf("%-8s %s/upstream's best (%.0f ms, either way): plain %.2fx, prestarted %.2fx", r.Workload, r.Runtime, b, r.PlainP50/b, r.PrestartedP50/b)
			if r.PrespawnedP50 > 0 {
				fmt.Printf(", prespawned (runsc restore started beforehand too) %.2fx", r.PrespawnedP50/b)
			}
			if r.PrerestoredP50 > 0 {
				fmt.Printf(", prerestored (resume of a paused clone) %.2fx", r.PrerestoredP50/b)
			}
			if r.PrespawnedResumeP50 > 0 {
				fmt.Printf(", prespawned resume (its runsc resume started beforehand too) %.2fx", r.PrespawnedResumeP50/b)
			}
			fmt.Println()
		}
	}
}
