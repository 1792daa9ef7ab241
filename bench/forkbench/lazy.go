package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkvisor/forkvisor/internal/lazybase"
	"github.com/forkvisor/forkvisor/internal/ociregistry"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// LazyResult is one way of getting a parked sandbox running on a node, in
// the lazy scenario: from the node that parked it (forkvisor only: learn,
// the first restore there, which learns the base's write set from a
// speculative copy of the whole base; then warm, a restore that applies the
// learned write set, as every later restore on that node does), after
// pulling it whole onto a cold node (pull), or on a cold node from a lazy
// pull (lazy, forkvisor only). forkvisor pushes after its first restore, so
// the artifact carries the learned write set, and both cold nodes apply it
// from their first restore.
type LazyResult struct {
	Runtime string `json:"runtime"`
	Mode    string `json:"mode"`
	HeapMiB int    `json:"heap_mib"`

	// PullMs and PullBytes: the pull (0 for learn and warm); bytes are those
	// the tool reported fetching.
	PullMs    float64 `json:"pull_ms"`
	PullBytes int64   `json:"pull_bytes"`
	// RestoreMs is restore → first tick; TotalMs is PullMs + RestoreMs.
	RestoreMs float64 `json:"restore_ms"`
	TotalMs   float64 `json:"total_ms"`
	// PassMs is restore → the end of the workload's first full pass over
	// its heap after the first tick.
	PassMs float64 `json:"pass_ms"`
	// FetchedFirstBytes and FetchedPassBytes: base bytes the lazy fetcher
	// had fetched at the first tick and after the full pass (lazy only).
	FetchedFirstBytes int64 `json:"fetched_first_bytes"`
	FetchedPassBytes  int64 `json:"fetched_pass_bytes"`

	Runs []LazyResult `json:"runs,omitempty"`
}

// lazyCheckMiB is how much of the heap the workload checks per tick: a
// first tick touches little of a large base, and a full pass takes
// heap/lazyCheckMiB ticks.
const lazyCheckMiB = 8

// lazyRestores runs the lazy scenario (perRegistry).
func lazyRestores(dir string, runtimes []runtimeConfig, heapMiB int) []LazyResult {
	runs := map[string][]LazyResult{}
	var order []string
	perRegistry(dir, "lazy", runtimes, func(rt runtimeConfig, reg *ociregistry.Registry, i int) {
		for _, r := range lazyRun(filepath.Join(dir, fmt.Sprintf("lazy-%s-%d", rt.name, i)), rt, reg, heapMiB) {
			key := r.Runtime + "/" + r.Mode
			if len(runs[key]) == 0 && i == 0 {
				order = append(order, key)
			}
			runs[key] = append(runs[key], r)
		}
	})
	var out []LazyResult
	for _, key := range order {
		rs := runs[key]
		med := func(get func(LazyResult) float64) float64 { return medianBy(rs, get) }
		m := rs[0]
		m.PullMs = med(func(r LazyResult) float64 { return r.PullMs })
		m.PullBytes = int64(med(func(r LazyResult) float64 { return float64(r.PullBytes) }))
		m.RestoreMs = med(func(r LazyResult) float64 { return r.RestoreMs })
		m.TotalMs = med(func(r LazyResult) float64 { return r.TotalMs })
		m.PassMs = med(func(r LazyResult) float64 { return r.PassMs })
		m.FetchedFirstBytes = int64(med(func(r LazyResult) float64 { return float64(r.FetchedFirstBytes) }))
		m.FetchedPassBytes = int64(med(func(r LazyResult) float64 { return float64(r.FetchedPassBytes) }))
		m.Runs = rs
		out = append(out, m)
	}
	return out
}

// lazyRun parks a heapMiB tick workload on node A with rt, pushes it, and
// measures each way of running it that rt has.
func lazyRun(dir string, rt runtimeConfig, reg *ociregistry.Registry, heapMiB int) []LazyResult {
	nodeA := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(dir, "a", "root"), Upstream: !rt.fork, LogDir: runtimeLogDir("lazy-a", rt)}
	defer os.RemoveAll(dir)
	addCleanup(nodeA.Cleanup)
	defer nodeA.Cleanup()
	bundle, image := parkOnNode(nodeA, dir, rt, heapMiB, lazyCheckMiB)
	ref := reg.Addr + "/forkbench/lazy-" + rt.name + ":v1"
	if !rt.fork {
		ociTool(nodeA, "push", image, ref)
	}

	var out []LazyResult
	// restore restores id on node from img, and measures the first tick and
	// the first full pass; fetched, if not nil, is read at both.
	restore := func(node *sandbox.Runsc, img, id string, fetched func() int64, res *LazyResult) {
		outPath := filepath.Join(dir, id+".out")
		start := time.Now()
		first, took, err := node.RestoreFirstTick(bundle, id, img, outPath, rt.restoreArgs...)
		must(err)
		res.RestoreMs = ms(took)
		if fetched != nil {
			res.FetchedFirstBytes = fetched()
		}
		_, _, err = sandbox.WaitTick(outPath, 0, 300*time.Second, func(t sandbox.Tick) bool { return t.N >= first.N+heapMiB/lazyCheckMiB })
		must(err)
		res.PassMs = ms(time.Since(start))
		if fetched != nil {
			res.FetchedPassBytes = fetched()
		}
		res.TotalMs = res.PullMs + res.RestoreMs
		node.Destroy(id)
	}
	if rt.fork {
		// The warm restore applies the set that this first restore
		// learns; wait until it is written.
		learn := LazyResult{Runtime: rt.name, Mode: "learn", HeapMiB: heapMiB}
		restore(nodeA, image, "learn", nil, &learn)
		out = append(out, learn)
		if err := sandbox.WaitWriteSet(nodeA.WriteSetPath(image), 15*time.Second); err != nil {
			fatalf("lazy: the first restore on node A learned no write set, so the warm restore would learn again: %v", err)
		}
		if out := ociTool(nodeA, "push", image, ref); !strings.Contains(out, "pushed with the checkpoint") {
			fatalf("lazy: the push did not carry the learned write set:\n%s", out)
		}
		warm := LazyResult{Runtime: rt.name, Mode: "warm", HeapMiB: heapMiB}
		restore(nodeA, image, "warm", nil, &warm)
		out = append(out, warm)
	}
	// A cold node pulls the whole checkpoint (forkvisor: and verifies and
	// stores its base), then restores.
	nodeC := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(dir, "c", "root"), Upstream: !rt.fork, LogDir: runtimeLogDir("lazy-c", rt)}
	addCleanup(nodeC.Cleanup)
	defer nodeC.Cleanup()
	pull := LazyResult{Runtime: rt.name, Mode: "pull", HeapMiB: heapMiB}
	start := time.Now()
	pullOut := ociTool(nodeC, "pull", ref, filepath.Join(dir, "c", "image"))
	pull.PullMs = ms(time.Since(start))
	pull.PullBytes = bytesIn(pullOut, "fetched")
	restore(nodeC, filepath.Join(dir, "c", "image"), "pulled", nil, &pull)
	out = append(out, pull)
	if !rt.fork {
		return out
	}
	// A cold node with the lazy fetcher pulls the checkpoint files only and
	// restores at once.
	nodeB := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(dir, "b", "root"), LogDir: runtimeLogDir("lazy-b", rt)}
	addCleanup(nodeB.Cleanup)
	defer nodeB.Cleanup()
	must(os.MkdirAll(nodeB.StorePath(), 0o755))
	d, err := lazybase.Start(abs(*ociBin), nodeB.StorePath(), nil, filepath.Join(dir, "lazyd.log"))
	must(err)
	addCleanup(d.Stop)
	defer d.Stop()
	lazy := LazyResult{Runtime: rt.name, Mode: "lazy", HeapMiB: heapMiB}
	start = time.Now()
	pullOut = ociTool(nodeB, "--lazy", "pull", ref, filepath.Join(dir, "b", "image"))
	lazy.PullMs = ms(time.Since(start))
	lazy.PullBytes = bytesIn(pullOut, "fetched")
	hex := strings.TrimPrefix(digestIn(pullOut), "sha256:")
	fetched := func() int64 {
		fs, err := lazybase.Fetches(nodeB.StorePath(), hex)
		must(err)
		var n int64
		for _, f := range fs {
			n += f.Bytes
		}
		return n
	}
	// The pull also had lazyd fetch the blocks of the write set that came
	// with the checkpoint (what every restore copies first).
	if !strings.Contains(pullOut, "through the lazy fetcher:") || strings.Contains(pullOut, "not fetched") {
		fatalf("lazy: the pull did not have lazyd fetch the write set's blocks:\n%s", pullOut)
	}
	lazy.PullBytes += fetched()
	restore(nodeB, filepath.Join(dir, "b", "image"), "lazy", fetched, &lazy)
	out = append(out, lazy)
	if logs := runtimeLogDir("lazy-b", rt); logs != "" {
		// Keep the fetch log (when each block was fetched, and whether
		// lazyd started it ahead of any reader) beside the node's runsc
		// logs; prefetches still in flight are not in it yet.
		log, err := os.ReadFile(lazybase.FetchLogPath(nodeB.StorePath(), hex))
		must(err)
		must(os.WriteFile(filepath.Join(logs, "fetches.jsonl"), log, 0o644))
	}
	return out
}

// digestIn returns the base digest ("sha256:<hex>") that forkvisor-oci
// printed.
func digestIn(out string) string {
	for _, f := range strings.Fields(out) {
		if f = strings.TrimSuffix(f, ":"); strings.HasPrefix(f, "sha256:") && len(f) == len("sha256:")+64 {
			return f
		}
	}
	fatalf("no base digest in forkvisor-oci output:\n%s", out)
	return ""
}

func printLazy(results []LazyResult) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\nlazy: medians over %d run(s); restore and pass are from the start of the restore; MiB fetched: by the pull (for a lazy pull, with the write set's blocks that lazyd fetched for it), and by the lazy fetcher in all (the pull's included) at the first tick / after a full pass", len(results[0].Runs))
	fmt.Printf("\n%-12s %-5s %5s %8s %9s %8s %9s %8s %10s %10s\n", "lazy", "mode", "heap", "pull_ms", "pull_MiB", "rst_ms", "total_ms", "pass_ms", "lazy_1st", "lazy_pass")
	var warm, lazy, lazyRestore, pull float64
	for _, r := range results {
		fmt.Printf("%-12s %-5s %5d %8.0f %9.1f %8.0f %9.0f %8.0f %10.1f %10.1f\n", r.Runtime, r.Mode, r.HeapMiB, r.PullMs, mib(r.PullBytes), r.RestoreMs, r.TotalMs, r.PassMs, mib(r.FetchedFirstBytes), mib(r.FetchedPassBytes))
		if r.Runtime == "forkvisor" {
			switch r.Mode {
			case "warm":
				warm = r.RestoreMs
			case "lazy":
				lazy = r.TotalMs
				lazyRestore = r.RestoreMs
			case "pull":
				pull = r.TotalMs
			}
		}
	}
	if warm > 0 && lazy > 0 && pull > 0 {
		fmt.Printf("forkvisor lazy pull + restore → first tick: %.2fx of a warm-node restore (one that applies the write set its node learned), %.1fx faster than pull + verify + restore\n", lazy/warm, pull/lazy)
		fmt.Printf("forkvisor lazy restore alone (after the pull of the checkpoint files and the write set's blocks) → first tick: %.2fx of a warm-node restore\n", lazyRestore/warm)
	}
}
