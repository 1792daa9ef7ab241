package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/forkvisor/forkvisor/internal/ociregistry"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// FleetResult is one runtime's numbers for the registry scenario: a sandbox
// parked on node A and pushed, pulled on a cold node B and restored; then a
// clone of it parked again on A, pushed, and pulled on B, which now holds
// the base.
type FleetResult struct {
	Runtime string `json:"runtime"`
	HeapMiB int    `json:"heap_mib"`

	PushMs          float64 `json:"push_ms"`
	PushBytes       int64   `json:"push_bytes"`
	ColdPullMs      float64 `json:"cold_pull_ms"`
	ColdPullBytes   int64   `json:"cold_pull_bytes"`
	ColdRestoreMs   float64 `json:"cold_restore_ms"`
	RepushBytes     int64   `json:"repush_bytes"`
	WarmPullMs      float64 `json:"warm_pull_ms"`
	WarmPullBytes   int64   `json:"warm_pull_bytes"`
	WarmRestoreMs   float64 `json:"warm_restore_ms"`
	ColdPullTotalMs float64 `json:"cold_pull_plus_restore_ms"`

	// Runs holds every repetition's numbers; the fields above are their
	// medians.
	Runs []FleetResult `json:"runs,omitempty"`
}

// fleet runs the registry scenario for each runtime (plain upstream, and
// forkvisor with --shared-base) against a registry on loopback, -repeat
// times.
func fleet(dir string, runtimes []runtimeConfig, heapMiB int) []FleetResult {
	runs := map[string][]FleetResult{}
	perRegistry(dir, "registry", runtimes, func(rt runtimeConfig, reg *ociregistry.Registry, i int) {
		runs[rt.name] = append(runs[rt.name], fleetRun(filepath.Join(dir, fmt.Sprintf("fleet-%s-%d", rt.name, i)), rt, reg, heapMiB))
	})
	var out []FleetResult
	for _, rt := range runtimes {
		out = append(out, mergeFleet(runs[rt.name]))
	}
	return out
}

// mergeFleet returns the medians of runs, field by field, with the runs.
func mergeFleet(runs []FleetResult) FleetResult {
	med := func(get func(FleetResult) float64) float64 { return medianBy(runs, get) }
	m := runs[0]
	m.PushMs = med(func(r FleetResult) float64 { return r.PushMs })
	m.PushBytes = int64(med(func(r FleetResult) float64 { return float64(r.PushBytes) }))
	m.ColdPullMs = med(func(r FleetResult) float64 { return r.ColdPullMs })
	m.ColdPullBytes = int64(med(func(r FleetResult) float64 { return float64(r.ColdPullBytes) }))
	m.ColdRestoreMs = med(func(r FleetResult) float64 { return r.ColdRestoreMs })
	m.ColdPullTotalMs = med(func(r FleetResult) float64 { return r.ColdPullTotalMs })
	m.RepushBytes = int64(med(func(r FleetResult) float64 { return float64(r.RepushBytes) }))
	m.WarmPullMs = med(func(r FleetResult) float64 { return r.WarmPullMs })
	m.WarmPullBytes = int64(med(func(r FleetResult) float64 { return float64(r.WarmPullBytes) }))
	m.WarmRestoreMs = med(func(r FleetResult) float64 { return r.WarmRestoreMs })
	m.Runs = runs
	return m
}

// fleetRun is one repetition (run) of the registry scenario for rt.
func fleetRun(dir string, rt runtimeConfig, reg *ociregistry.Registry, heapMiB int) FleetResult {
	res := FleetResult{Runtime: rt.name, HeapMiB: heapMiB}
	nodeA := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(dir, "a", "root"), Upstream: !rt.fork, LogDir: runtimeLogDir("registry-a", rt)}
	nodeB := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(dir, "b", "root"), Upstream: !rt.fork, LogDir: runtimeLogDir("registry-b", rt)}
	// Deferred calls run last first: sandboxes go before their files.
	defer os.RemoveAll(dir)
	for _, r := range []*sandbox.Runsc{nodeA, nodeB} {
		addCleanup(r.Cleanup)
		defer r.Cleanup()
	}
	bundle, image := parkOnNode(nodeA, dir, rt, heapMiB, 4)
	var flags []string
	if rt.fork {
		flags = []string{"--shared-base"}
	}
	ref := reg.Addr + "/forkbench/" + rt.name

	// Push, cold pull on B, restore on B.
	start := time.Now()
	out := ociTool(nodeA, "push", image, ref+":v1")
	res.PushMs = ms(time.Since(start))
	res.PushBytes = bytesIn(out, "uploaded")
	res.ColdPullMs, res.ColdPullBytes, res.ColdRestoreMs = pullAndRestore(nodeB, bundle, ref+":v1", filepath.Join(dir, "b"), "b1")
	res.ColdPullTotalMs = res.ColdPullMs + res.ColdRestoreMs

	// A clone on A runs a while and is parked again (forkvisor: against the
	// same base), pushed, and pulled on B, which holds the base now.
	cloneOut := filepath.Join(dir, "a1.out")
	ft, _, err := nodeA.RestoreFirstTick(bundle, "a1", image, cloneOut)
	must(err)
	_, _, err = sandbox.WaitTick(cloneOut, 0, 120*time.Second, func(t sandbox.Tick) bool { return t.N >= ft.N+5 })
	must(err)
	image2 := filepath.Join(dir, "a", "image-v2")
	must(nodeA.Checkpoint("a1", image2, flags...))
	nodeA.Destroy("a1")
	out = ociTool(nodeA, "push", image2, ref+":v2")
	res.RepushBytes = bytesIn(out, "uploaded")
	res.WarmPullMs, res.WarmPullBytes, res.WarmRestoreMs = pullAndRestore(nodeB, bundle, ref+":v2", filepath.Join(dir, "b"), "b2")
	return res
}

// parkOnNode runs a heapMiB tick workload (checkMiB of its heap checked per
// 50 ms tick) as "source" on node, with the bundle in dir/bundle, and parks
// it into dir/a/image (forkvisor: --shared-base); it returns the bundle and
// the image.
func parkOnNode(node *sandbox.Runsc, dir string, rt runtimeConfig, heapMiB, checkMiB int) (bundle, image string) {
	bundle = filepath.Join(dir, "bundle")
	must(sandbox.NewBundle(bundle, abs(*tickBin), "-mib", fmt.Sprint(heapMiB), "-interval", "50ms", "-check-mib", fmt.Sprint(checkMiB)))
	_, err := node.RunUntilTick(bundle, "source", filepath.Join(dir, "source.out"), 2, nil)
	must(err)
	var flags []string
	if rt.fork {
		flags = []string{"--shared-base"}
	}
	image = filepath.Join(dir, "a", "image")
	must(node.Checkpoint("source", image, flags...))
	node.Destroy("source")
	return bundle, image
}

// pullAndRestore pulls ref on node into dir/image-<id>, restores container
// id from it and removes it; it returns the pull's milliseconds and fetched
// bytes, and the restore's milliseconds to the first tick.
func pullAndRestore(node *sandbox.Runsc, bundle, ref, dir, id string) (pullMs float64, fetched int64, restoreMs float64) {
	image := filepath.Join(dir, "image-"+id)
	start := time.Now()
	out := ociTool(node, "pull", ref, image)
	pullMs = ms(time.Since(start))
	fetched = bytesIn(out, "fetched")
	_, took, err := node.RestoreFirstTick(bundle, id, image, filepath.Join(dir, id+".out"))
	must(err)
	restoreMs = ms(took)
	node.Destroy(id)
	return pullMs, fetched, restoreMs
}

// ociTool runs bin/forkvisor-oci for node r (its base store; the fork's
// runsc verifies and stores pulled bases) and returns its output.
func ociTool(r *sandbox.Runsc, args ...string) string {
	cmd := exec.Command(abs(*ociBin), append([]string{"--plain-http", "--base-store", r.StorePath(), "--runsc", abs(*forkBin)}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		fatalf("forkvisor-oci %v: %v: %s", args, err, out)
	}
	return string(out)
}

// bytesIn returns N from the line "<word> N bytes" of out.
func bytesIn(out, word string) int64 {
	m := regexp.MustCompile(regexp.QuoteMeta(word) + ` (\d+) bytes`).FindStringSubmatch(out)
	if m == nil {
		fatalf("no %q byte count in forkvisor-oci output:\n%s", word, out)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

func printFleet(results []FleetResult) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\nregistry: medians over %d run(s); MiB are bytes the tool moved (push: uploaded, pull: fetched)", len(results[0].Runs))
	fmt.Printf("\n%-10s %5s %8s %9s %9s %10s %10s %11s %10s %10s %10s\n",
		"registry", "heap", "push_ms", "push_MiB", "cold_pull", "cold_MiB", "cold_rst", "repush_MiB", "warm_pull", "warm_MiB", "warm_rst")
	for _, r := range results {
		fmt.Printf("%-10s %5d %8.0f %9.1f %9.0f %10.1f %10.0f %11.1f %10.0f %10.2f %10.0f\n",
			r.Runtime, r.HeapMiB, r.PushMs, mib(r.PushBytes), r.ColdPullMs, mib(r.ColdPullBytes), r.ColdRestoreMs,
			mib(r.RepushBytes), r.WarmPullMs, mib(r.WarmPullBytes), r.WarmRestoreMs)
	}
}

// perRegistry calls run for each repetition (-repeat) and runtime,
// alternating runtimes within a repetition. Each repetition has a registry
// of its own on loopback, removed after it, so that no run finds blocks of
// an earlier one.
func perRegistry(dir, scenario string, runtimes []runtimeConfig, run func(rt runtimeConfig, reg *ociregistry.Registry, i int)) {
	for i := 0; i < *repeat; i++ {
		reg, err := ociregistry.Start(ociregistry.Binary(abs(".")), filepath.Join(dir, fmt.Sprintf("%s-registry-%d", scenario, i)), "", "")
		must(err)
		addCleanup(reg.Stop)
		for _, rt := range runtimes {
			fmt.Fprintf(os.Stderr, "forkbench: %s, %s, run %d/%d\n", scenario, rt.name, i+1, *repeat)
			run(rt, reg, i)
		}
		reg.Stop()
		os.RemoveAll(reg.Storage)
	}
}
