package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// BurstResult is one runtime's burst in one mode: n restores of one parked sandbox
// started at the same instant, as an agent platform does when a queue drains
// or a task fans out.
type BurstResult struct {
	Runtime  string    `json:"runtime"`
	Mode     burstMode `json:"mode"`
	HeapMiB  int       `json:"heap_mib"`
	Restores int       `json:"restores"`
	WallMs   float64   `json:"wall_ms"` // first start → last first tick
	// RestoreMs is each restore's (or resume's) start → first tick.
	RestoreMs    []float64 `json:"restore_ms"`
	RestoreP50Ms float64   `json:"restore_p50_ms"`
	RestoreMaxMs float64   `json:"restore_max_ms"`
	// CPUMs is each restore's sentry CPU time at its first tick; for a
	// sandbox created or restored beforehand, less what it had used by
	// then.
	CPUMs    []float64 `json:"cpu_ms"`
	CPUP50Ms float64   `json:"cpu_p50_ms"`
	// RestoreCPUMs is each restore's CPU time in all its processes when
	// its first tick is seen: the runsc command that served it
	// (sandbox.CommandCPU), and the sandbox's sentry, stubs, gofer and
	// their helpers (sandbox.SandboxTreeCPU); for what was created or
	// started beforehand, less what it had used by then.
	RestoreCPUMs    []float64 `json:"all_processes_cpu_ms"`
	RestoreCPUP50Ms float64   `json:"all_processes_cpu_p50_ms"`
	TotalPssMiB     float64   `json:"total_pss_mib"` // once every clone read its heap (memstat.Usage.Total)
	// PoolPssMiB is the total memory (memstat.Usage.Total) of the n
	// sandboxes while they wait for the burst (0 for plain restores, which
	// have none).
	PoolPssMiB float64 `json:"pool_pss_mib"`
}

// burstMode says what exists of a burst's sandboxes before it starts.
type burstMode string

const (
	// burstPlain: nothing; each `runsc restore` creates its sandbox.
	burstPlain burstMode = "plain"
	// burstPrestarted: n sandboxes created beforehand (`runsc create`),
	// as an orchestrator's pool of that size holds them; the burst
	// restores the image into them.
	burstPrestarted burstMode = "prestarted"
	// burstPrespawned: n sandboxes created beforehand, each with its
	// `runsc restore --image-path-from` started beforehand too (forkvisor
	// only), as a pool made by warmpool.NewPrespawned holds them; the burst
	// sends each the image path.
	burstPrespawned burstMode = "prespawned"
	// burstPrerestored: n clones of the image restored beforehand with
	// `runsc restore --paused` (forkvisor only: upstream cannot restore
	// without running the tasks), as a pool of paused clones
	// (warmpool.NewRestored) holds them; the burst is n `runsc resume`.
	burstPrerestored burstMode = "prerestored"
	// burstPrespawnedResume: burstPrerestored, each clone with its `runsc
	// resume --wait-line-from` started beforehand too, as a pool made by
	// warmpool.NewRestoredPrespawned holds them; the burst sends each its
	// line, and starts no runsc process.
	burstPrespawnedResume burstMode = "prespawned-resume"
)

// burst parks a heapMiB tick workload with each runtime and restores n
// clones of it at once (each in its own goroutine), then measures the
// clones' memory once every one has read its whole heap, in each
// burstMode the runtime has. Each mode parks its own source (same
// workload, its own image and runsc root).
func burst(dir string, runtimes []runtimeConfig, n, heapMiB int) []BurstResult {
	var results []BurstResult
	for _, modes := range eachRuntime(dir, "burst", runtimes, func(base string, rt runtimeConfig) []BurstResult {
		defer os.RemoveAll(base)
		modes := []burstMode{burstPlain, burstPrestarted}
		if rt.name == "forkvisor" {
			modes = append(modes, burstPrespawned, burstPrerestored, burstPrespawnedResume)
		}
		var rs []BurstResult
		for _, mode := range modes {
			rs = append(rs, burstOne(filepath.Join(base, string(mode)), rt, n, heapMiB, mode))
		}
		return rs
	}) {
		results = append(results, modes...)
	}
	return results
}

func burstOne(base string, rt runtimeConfig, n, heapMiB int, mode burstMode) BurstResult {
	p := parkTick(base, "burst", rt, "-mib", fmt.Sprint(heapMiB), "-interval", "50ms")
	r := p.r
	defer os.RemoveAll(base)
	defer r.Cleanup()

	res := BurstResult{Runtime: rt.name, Mode: mode, HeapMiB: heapMiB, Restores: n, RestoreMs: make([]float64, n), CPUMs: make([]float64, n), RestoreCPUMs: make([]float64, n)}
	ids, outs := make([]string, n), make([]string, n)
	createCPU, createTreeCPU := make([]time.Duration, n), make([]time.Duration, n)
	pending := make([]*sandbox.PendingRestore, n)
	resumes := make([]*sandbox.PendingResume, n)
	for i := 0; i < n; i++ {
		// Fixed-width IDs: runsc resolves a container ID that matches no
		// container as a unique prefix of one, so "burst1" restored while
		// "burst15" already exists would find (and refuse) the latter.
		ids[i] = fmt.Sprintf("burst%0*d", len(fmt.Sprint(n-1)), i)
		outs[i] = filepath.Join(base, ids[i]+".out")
		switch mode {
		case burstPrestarted:
			must(r.Create(p.bundle, ids[i], outs[i]))
		case burstPrespawned:
			// What warmpool.NewPrespawned does, without its pool (see
			// below).
			must(r.Create(p.bundle, ids[i], outs[i]))
			var err error
			pending[i], err = r.StartRestore(p.bundle, ids[i], outs[i], rt.restoreArgs...)
			must(err)
		case burstPrerestored, burstPrespawnedResume:
			// What warmpool.NewRestored (NewRestoredPrespawned) does,
			// without its pool: a burst through Pool.Restore would start
			// refills next to the resumes it times.
			must(r.Restore(p.bundle, ids[i], p.image, outs[i], append([]string{"--paused"}, rt.restoreArgs...)...))
			if !r.Paused(ids[i]) {
				fatalf("burst %s: %s is not paused after runsc restore --paused", rt.name, ids[i])
			}
			if mode == burstPrespawnedResume {
				var err error
				resumes[i], err = r.StartResume(ids[i], outs[i])
				must(err)
			}
		}
	}
	if mode != burstPlain {
		// A pool filled earlier is idle when the burst comes: let the
		// last sandboxes' background work end before timing.
		time.Sleep(time.Second)
		for i, id := range ids {
			cpu, err := r.SentryCPU(id)
			must(err)
			createCPU[i] = cpu
			tree, err := r.SandboxTreeCPU(id)
			must(err)
			createTreeCPU[i] = tree
			if pending[i] != nil {
				createTreeCPU[i] += pending[i].CPU()
			}
			if resumes[i] != nil {
				createTreeCPU[i] += resumes[i].CPU()
			}
		}
		pool, err := r.Memory(ids...)
		must(err)
		res.PoolPssMiB = float64(pool.All.Total()) / 1024
		if mode == burstPrespawned || mode == burstPrespawnedResume {
			// The waiting runsc processes are part of what the pool holds.
			var pids []int
			for i := range ids {
				waiting, pid := false, 0
				if pending[i] != nil {
					waiting, pid = pending[i].Waiting(), pending[i].Pid()
				} else {
					waiting, pid = resumes[i].Waiting(), resumes[i].Pid()
				}
				if !waiting {
					fatalf("burst %s: the prespawned runsc process of %s ended before the burst", rt.name, ids[i])
				}
				pids = append(pids, pid)
			}
			waiting, err := memstat.Processes(pids)
			must(err)
			res.PoolPssMiB += float64(waiting.Total()) / 1024
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
			var err error
			var commandCPU time.Duration
			switch {
			case mode == burstPrerestored:
				commandCPU, err = r.ResumeWithCPU(ids[i])
			case resumes[i] != nil:
				err = resumes[i].Resume()
				commandCPU = resumes[i].CPU()
			case pending[i] != nil:
				err = pending[i].Restore(p.image)
				commandCPU = pending[i].CPU()
			default:
				commandCPU, err = r.RestoreWithCPU(p.bundle, ids[i], p.image, outs[i], rt.restoreArgs...)
			}
			if err != nil {
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
			if err != nil {
				errs[i] = err
				return
			}
			res.CPUMs[i] = ms(cpu - createCPU[i])
			tree, err := r.SandboxTreeCPU(ids[i])
			errs[i] = err
			res.RestoreCPUMs[i] = ms(commandCPU + tree - createTreeCPU[i])
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
	res.RestoreCPUP50Ms = median(res.RestoreCPUMs)
	// Let every clone read its whole heap, then measure.
	for _, out := range outs {
		waitFullPass(out, heapMiB, 4)
	}
	m, err := r.Memory(ids...)
	must(err)
	res.TotalPssMiB = float64(m.All.Total()) / 1024
	return res
}

func printBurst(results []BurstResult) {
	if len(results) == 0 {
		return
	}
	r0 := results[0]
	fmt.Printf("\nburst: %d restores of one parked %d MiB sandbox started at once; prestarted: into %d sandboxes created beforehand, prespawned: the same with each one's runsc restore --image-path-from started beforehand too, prerestored: %d resumes of clones restored paused beforehand, prespawned-resume: the same with each one's runsc resume --wait-line-from started beforehand too (none of that timed; pool_MiB: their memory while they wait, prespawned runsc processes included)\n", r0.Restores, r0.HeapMiB, r0.Restores, r0.Restores)
	fmt.Printf("CPU ms per restore, read when its first tick is seen (polled every 10 ms): sentry_cpu_p50, the sandbox process's alone; restore_cpu_p50, all its processes (the runsc command that served it, sentry, stubs, gofer, helpers); both less what a pool's processes used beforehand\n")
	fmt.Printf("%-11s %-17s %9s %9s %9s %14s %15s %10s %10s\n", "runtime", "mode", "wall_ms", "rst_p50", "rst_max", "sentry_cpu_p50", "restore_cpu_p50", "total_MiB", "pool_MiB")
	for _, r := range results {
		fmt.Printf("%-11s %-17s %9.0f %9.0f %9.0f %14.0f %15.0f %10.1f %10.1f\n", r.Runtime, r.Mode, r.WallMs, r.RestoreP50Ms, r.RestoreMaxMs, r.CPUP50Ms, r.RestoreCPUP50Ms, r.TotalPssMiB, r.PoolPssMiB)
	}
	// ratio formats a/b, or n/a where b is not positive.
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	// best returns upstream's (or upstream-bg's) burst with the shortest
	// wall time among those in modes, or a zero result.
	best := func(modes ...burstMode) (b BurstResult) {
		for _, r := range results {
			if r.Runtime != "forkvisor" && slices.Contains(modes, r.Mode) && (b.Runtime == "" || r.WallMs < b.WallMs) {
				b = r
			}
		}
		return b
	}
	for _, r := range results {
		if r.Runtime != "forkvisor" {
			continue
		}
		if b := best(r.Mode); b.WallMs > 0 {
			fmt.Printf("burst forkvisor %s/upstream %s (%s): wall %s, cpu per restore %s (sentry's %s), total memory %s\n", r.Mode, b.Mode, b.Runtime, ratio(r.WallMs, b.WallMs), ratio(r.RestoreCPUP50Ms, b.RestoreCPUP50Ms), ratio(r.CPUP50Ms, b.CPUP50Ms), ratio(r.TotalPssMiB, b.TotalPssMiB))
		}
		// Across modes, the CPU columns count different work (a plain
		// restore's includes creating its sandbox, a pre-started one's
		// does not): wall, the CPU of the restores' processes (what the
		// burst itself costs, a pool's earlier work left out) and Pss,
		// against upstream's plain burst and against its best.
		if r.Mode == burstPlain {
			continue
		}
		if b := best(burstPlain); b.WallMs > 0 {
			fmt.Printf("burst forkvisor %s/upstream %s (%s): wall %s, cpu per restore in the burst %s, total memory %s\n", r.Mode, b.Mode, b.Runtime, ratio(r.WallMs, b.WallMs), ratio(r.RestoreCPUP50Ms, b.RestoreCPUP50Ms), ratio(r.TotalPssMiB, b.TotalPssMiB))
		}
		if b := best(burstPlain, burstPrestarted); (r.Mode == burstPrerestored || r.Mode == burstPrespawned || r.Mode == burstPrespawnedResume) && b.Mode != burstPlain && b.WallMs > 0 {
			fmt.Printf("burst forkvisor %s/upstream %s (%s): wall %s, cpu per restore in the burst %s, total memory %s\n", r.Mode, b.Mode, b.Runtime, ratio(r.WallMs, b.WallMs), ratio(r.RestoreCPUP50Ms, b.RestoreCPUP50Ms), ratio(r.TotalPssMiB, b.TotalPssMiB))
		}
	}
}
