package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// BurstResult is one runtime's burst in one mode: n restores of one parked sandbox
// started at the same instant, as an agent platform does when a queue drains
// or a task fans out.
type BurstResult struct {
	Runtime string `json:"runtime"`
	// Prestarted is true if each restore went into a sandbox created
	// beforehand (`runsc create`, not timed), as from a pool of n.
	Prestarted bool    `json:"pool"`
	HeapMiB    int     `json:"heap_mib"`
	Restores   int     `json:"restores"`
	WallMs     float64 `json:"wall_ms"` // first start → last first tick
	// RestoreMs is each restore's start → first tick.
	RestoreMs    []float64 `json:"restore_ms"`
	RestoreP50Ms float64   `json:"restore_p50_ms"`
	RestoreMaxMs float64   `json:"restore_max_ms"`
	// CPUMs is each restore's sentry CPU time at its first tick; for a
	// sandbox created beforehand, less what it had used once created.
	CPUMs       []float64 `json:"cpu_ms"`
	CPUP50Ms    float64   `json:"cpu_p50_ms"`
	TotalPssMiB float64   `json:"total_pss_mib"` // once every clone read its heap
}

// burst parks a heapMiB tick workload with each runtime and restores n
// clones of it at once (each in its own goroutine), then measures the
// clones' memory once every one has read its whole heap: once by plain
// restores, which create their sandboxes, and once into n sandboxes created
// beforehand, as an orchestrator's pool of that size would hold them. Each
// mode parks its own source (same workload, its own image and runsc root).
func burst(dir string, runtimes []runtimeConfig, n, heapMiB int) []BurstResult {
	var results []BurstResult
	for _, modes := range eachRuntime(dir, "burst", runtimes, func(base string, rt runtimeConfig) []BurstResult {
		defer os.RemoveAll(base)
		return []BurstResult{
			burstOne(filepath.Join(base, "plain"), rt, n, heapMiB, false),
			burstOne(filepath.Join(base, "prestarted"), rt, n, heapMiB, true),
		}
	}) {
		results = append(results, modes...)
	}
	return results
}

func burstOne(base string, rt runtimeConfig, n, heapMiB int, prestarted bool) BurstResult {
	p := parkTick(base, "burst", rt, "-mib", fmt.Sprint(heapMiB), "-interval", "50ms")
	r := p.r
	defer os.RemoveAll(base)
	defer r.Cleanup()

	res := BurstResult{Runtime: rt.name, Prestarted: prestarted, HeapMiB: heapMiB, Restores: n, RestoreMs: make([]float64, n), CPUMs: make([]float64, n)}
	ids, outs := make([]string, n), make([]string, n)
	createCPU := make([]time.Duration, n)
	for i := 0; i < n; i++ {
		// Fixed-width IDs: runsc resolves a container ID that matches no
		// container as a unique prefix of one, so "burst1" restored while
		// "burst15" already exists would find (and refuse) the latter.
		ids[i] = fmt.Sprintf("burst%0*d", len(fmt.Sprint(n-1)), i)
		outs[i] = filepath.Join(base, ids[i]+".out")
		if prestarted {
			must(r.Create(p.bundle, ids[i], outs[i]))
			cpu, err := r.SentryCPU(ids[i])
			must(err)
			createCPU[i] = cpu
		}
	}
	errs := make([]error, n)
	ends := make([]time.Time, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// Not RestoreFirstTick: 16 goroutines polling every
			// millisecond would take CPU from the restores they time.
			if err := r.Restore(p.bundle, ids[i], p.image, outs[i], rt.restoreArgs...); err != nil {
				errs[i] = err
				return
			}
			if _, _, err := sandbox.WaitForLineEvery(outs[i], 0, 300*time.Second, 10*time.Millisecond, sandbox.IsTick); err != nil {
				errs[i] = err
				return
			}
			ends[i] = time.Now()
			res.RestoreMs[i] = ms(ends[i].Sub(start))
			cpu, err := r.SentryCPU(ids[i])
			errs[i] = err
			res.CPUMs[i] = ms(cpu - createCPU[i])
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			fatalf("burst %s, restore %d: %v", rt.name, i, err)
		}
	}
	last := start
	for _, end := range ends {
		if end.After(last) {
			last = end
		}
	}
	res.WallMs = ms(last.Sub(start))
	res.RestoreP50Ms, res.RestoreMaxMs = median(res.RestoreMs), maxOf(res.RestoreMs)
	res.CPUP50Ms = median(res.CPUMs)
	// Let every clone read its whole heap, then measure.
	for _, out := range outs {
		waitFullPass(out, heapMiB, 4)
	}
	all, _, err := r.Memory(ids...)
	must(err)
	res.TotalPssMiB = float64(all.Pss) / 1024
	return res
}

func printBurst(results []BurstResult) {
	if len(results) == 0 {
		return
	}
	r0 := results[0]
	fmt.Printf("\nburst: %d restores of one parked %d MiB sandbox started at once; prestarted: into %d sandboxes created beforehand (not timed)\n", r0.Restores, r0.HeapMiB, r0.Restores)
	fmt.Printf("%-11s %-10s %9s %9s %9s %12s %10s\n", "runtime", "mode", "wall_ms", "rst_p50", "rst_max", "cpu_ms_p50", "total_Pss")
	for _, r := range results {
		fmt.Printf("%-11s %-10s %9.0f %9.0f %9.0f %12.0f %10.1f\n", r.Runtime, burstMode(r), r.WallMs, r.RestoreP50Ms, r.RestoreMaxMs, r.CPUP50Ms, r.TotalPssMiB)
	}
	// best returns the burst of the given mode, of upstream or upstream-bg,
	// with the shortest wall time.
	best := func(prestarted bool) (b BurstResult) {
		for _, r := range results {
			if r.Runtime != "forkvisor" && r.Prestarted == prestarted && (b.Runtime == "" || r.WallMs < b.WallMs) {
				b = r
			}
		}
		return b
	}
	for _, r := range results {
		if r.Runtime != "forkvisor" {
			continue
		}
		if b := best(r.Prestarted); b.WallMs > 0 && b.CPUP50Ms > 0 && b.TotalPssMiB > 0 {
			fmt.Printf("burst forkvisor %s/upstream %s (%s): wall %.2fx, cpu per restore %.2fx, total Pss %.2fx\n", burstMode(r), burstMode(b), b.Runtime, r.WallMs/b.WallMs, r.CPUP50Ms/b.CPUP50Ms, r.TotalPssMiB/b.TotalPssMiB)
		}
		// Across modes, the sentry CPU columns count different work (a
		// plain restore's includes creating its sandbox): wall and Pss only.
		if b := best(false); r.Prestarted && b.WallMs > 0 && b.TotalPssMiB > 0 {
			fmt.Printf("burst forkvisor %s/upstream %s (%s): wall %.2fx, total Pss %.2fx\n", burstMode(r), burstMode(b), b.Runtime, r.WallMs/b.WallMs, r.TotalPssMiB/b.TotalPssMiB)
		}
	}
}

func burstMode(r BurstResult) string {
	if r.Prestarted {
		return "prestarted"
	}
	return "plain"
}
