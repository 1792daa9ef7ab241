// Command forkbench measures shared-base clones side by side: upstream runsc
// (the same pin, unpatched) and forkvisor's runsc, the same workload on the
// same machine in one run. It prints a table and writes JSON.
//
// Scenarios (-scenarios, comma-separated):
//
//	clones256  park a 256 MiB tick workload, restore 8 clones
//	clones2g   park a 2 GiB tick workload, restore 2 clones
//	repark     park an unchanged clone again (after clones256)
//	layers     park and restore a sandbox with a writable layer (--overlay2
//	           filestore) of 64 MiB, 256 MiB and 1 GiB (-layer-sizes), on a
//	           loopback XFS; forkvisor keeps the layer out of the image
//	           (--skip-filestore-pages, --filestore-snapshot-dir) and adopts
//	           it on restore (--filestore-adopt-dir)
//
// Memory is Pss summed over every process of every clone sandbox (sentry,
// systrap stubs, gofer; each address space once), measured after every clone
// has read its whole heap. Restore latency is the wall time from starting
// `runsc restore --detach` to the first line the workload prints after
// restore.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

var (
	upstreamBin = flag.String("upstream", "bin/runsc-upstream", "upstream runsc")
	forkBin     = flag.String("fork", "bin/runsc", "forkvisor runsc")
	tickBin     = flag.String("tick", "bin/tick", "tick workload (static)")
	scenarios   = flag.String("scenarios", "clones256,repark,clones2g,layers", "scenarios to run")
	layerSizes  = flag.String("layer-sizes", "64,256,1024", "writable layer sizes in MiB for the layers scenario")
	layerRepeat = flag.Int("layer-repeat", 3, "runs per layer size and runtime (medians are reported)")
	workDir     = flag.String("work", "", "work directory (default: a new temporary directory, removed afterwards)")
	jsonOut     = flag.String("json", "bench/out/forkbench.json", "where to write the JSON results")
)

// Result is one runtime's numbers for one scenario.
type Result struct {
	Scenario string `json:"scenario"`
	Runtime  string `json:"runtime"`
	HeapMiB  int    `json:"heap_mib"`
	Clones   int    `json:"clones"`

	CheckpointMs    float64   `json:"checkpoint_ms"`
	ImageBytes      int64     `json:"image_bytes"`         // allocated on disk, all files of the image directory
	ImageBytesNoBas int64     `json:"image_bytes_no_base"` // the same, without base.img
	RestoreMs       []float64 `json:"restore_ms"`          // per clone: restore start -> first tick
	RestoreP50Ms    float64   `json:"restore_p50_ms"`
	RestoreMaxMs    float64   `json:"restore_max_ms"`

	TotalPssMiB    float64 `json:"total_pss_mib"`  // all processes of all clones
	SentryPssMiB   float64 `json:"sentry_pss_mib"` // sentries only
	TotalRssMiB    float64 `json:"total_rss_mib"`
	PerClonePssMiB float64 `json:"per_clone_pss_mib"`

	LayerMiB      int   `json:"layer_mib,omitempty"`
	Repeats       int   `json:"repeats,omitempty"`        // park_ms and restore p50 are medians over this many runs
	SnapshotBytes int64 `json:"snapshot_bytes,omitempty"` // allocated, exclusive of shared extents not counted
}

type runtime struct {
	name string
	bin  string
	fork bool
}

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		fatalf("forkbench needs root to run sandboxes")
	}
	for _, p := range []string{*upstreamBin, *forkBin, *tickBin} {
		if _, err := os.Stat(p); err != nil {
			fatalf("%v (run `make` first)", err)
		}
	}
	dir := *workDir
	if dir == "" {
		d, err := os.MkdirTemp("", "forkbench-")
		if err != nil {
			fatalf("%v", err)
		}
		dir = d
		defer os.RemoveAll(dir)
	}
	runtimes := []runtime{{"upstream", abs(*upstreamBin), false}, {"forkvisor", abs(*forkBin), true}}

	var results []Result
	want := map[string]bool{}
	for _, s := range strings.Split(*scenarios, ",") {
		want[strings.TrimSpace(s)] = true
	}
	for _, rt := range runtimes {
		if want["clones256"] || want["repark"] {
			res, repark := clones(dir, rt, "clones256", 256, 8, 4, want["repark"])
			if want["clones256"] {
				results = append(results, res)
			}
			if repark != nil {
				results = append(results, *repark)
			}
		}
		if want["clones2g"] {
			res, _ := clones(dir, rt, "clones2g", 2048, 2, 4, false)
			results = append(results, res)
		}
	}
	if want["layers"] {
		results = append(results, layers(dir, runtimes)...)
	}
	printTable(results)
	if *jsonOut != "" {
		if err := os.MkdirAll(filepath.Dir(*jsonOut), 0o755); err == nil {
			b, _ := json.MarshalIndent(map[string]any{
				"date":    time.Now().UTC().Format(time.RFC3339),
				"results": results,
			}, "", "  ")
			if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
				fatalf("%v", err)
			}
			fmt.Printf("\nJSON: %s\n", *jsonOut)
		}
	}
}

// clones parks a workload of heapMiB and restores n clones from it.
func clones(dir string, rt runtime, scenario string, heapMiB, n, checkMiB int, repark bool) (Result, *Result) {
	base := filepath.Join(dir, scenario+"-"+rt.name)
	r := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root")}
	cleanups = append(cleanups, r.Cleanup)
	defer r.Cleanup()
	bundle := filepath.Join(base, "bundle")
	must(sandbox.NewBundle(bundle, abs(*tickBin), "-mib", fmt.Sprint(heapMiB), "-interval", "50ms", "-check-mib", fmt.Sprint(checkMiB)))
	srcOut := filepath.Join(base, "source.out")
	must(r.Run(bundle, "source", srcOut))
	_, _, err := sandbox.WaitForLine(srcOut, 0, 120*time.Second, func(l string) bool {
		tk, err := sandbox.ParseTick(l)
		return err == nil && tk.N >= 2
	})
	must(err)

	res := Result{Scenario: scenario, Runtime: rt.name, HeapMiB: heapMiB, Clones: n}
	image := filepath.Join(base, "image")
	var flags []string
	if rt.fork {
		flags = append(flags, "--shared-base")
	}
	start := time.Now()
	must(r.Checkpoint("source", image, flags...))
	res.CheckpointMs = ms(time.Since(start))
	r.Destroy("source")
	res.ImageBytes, res.ImageBytesNoBas = diskUsage(image)

	var ids []string
	var outs []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("clone%d", i)
		out := filepath.Join(base, id+".out")
		start := time.Now()
		must(r.Restore(bundle, id, image, out))
		_, _, err := sandbox.WaitForLineEvery(out, 0, 60*time.Second, time.Millisecond, sandbox.IsTick)
		must(err)
		res.RestoreMs = append(res.RestoreMs, ms(time.Since(start)))
		ids = append(ids, id)
		outs = append(outs, out)
	}
	res.RestoreP50Ms, res.RestoreMaxMs = median(res.RestoreMs), maxOf(res.RestoreMs)

	// Let every clone read its whole heap, then measure.
	for _, out := range outs {
		first, _, err := sandbox.WaitForLine(out, 0, 10*time.Second, sandbox.IsTick)
		must(err)
		ft, _ := sandbox.ParseTick(first)
		line, _, err := sandbox.WaitForLine(out, 0, 300*time.Second, func(l string) bool {
			tk, err := sandbox.ParseTick(l)
			return err == nil && (tk.N >= ft.N+heapMiB/checkMiB+2 || !tk.OK)
		})
		must(err)
		if tk, _ := sandbox.ParseTick(line); !tk.OK {
			fatalf("%s %s: clone heap corrupt: %s", rt.name, scenario, line)
		}
	}
	var all, sentries memstat.Usage
	for _, id := range ids {
		pid, err := r.SandboxPID(id)
		must(err)
		m, err := memstat.OfSandbox(pid, r.GoferPID(id))
		must(err)
		all.Add(m.All)
		sentries.Add(m.Sentry)
	}
	res.TotalPssMiB = float64(all.Pss) / 1024
	res.TotalRssMiB = float64(all.Rss) / 1024
	res.SentryPssMiB = float64(sentries.Pss) / 1024
	res.PerClonePssMiB = res.TotalPssMiB / float64(n)

	var reparkRes *Result
	if repark {
		rp := Result{Scenario: "repark", Runtime: rt.name, HeapMiB: heapMiB, Clones: 1}
		image2 := filepath.Join(base, "image-repark")
		start := time.Now()
		must(r.Checkpoint(ids[0], image2, flags...))
		rp.CheckpointMs = ms(time.Since(start))
		rp.ImageBytes, rp.ImageBytesNoBas = diskUsage(image2)
		reparkRes = &rp
	}
	for _, id := range ids {
		r.Destroy(id)
	}
	return res, reparkRes
}

func printTable(results []Result) {
	fmt.Printf("\n%-10s %-10s %5s %6s %9s %12s %12s %9s %9s %11s %11s %10s\n",
		"scenario", "runtime", "heap", "clones", "ckpt_ms", "image_MiB", "img-base_MiB", "rst_p50", "rst_max", "total_Pss", "sentry_Pss", "Pss/clone")
	for _, r := range results {
		if r.Scenario == "layers" {
			continue
		}
		fmt.Printf("%-10s %-10s %5d %6d %9.0f %12.1f %12.1f %9.0f %9.0f %11.1f %11.1f %10.1f\n",
			r.Scenario, r.Runtime, r.HeapMiB, r.Clones, r.CheckpointMs, mib(r.ImageBytes), mib(r.ImageBytesNoBas),
			r.RestoreP50Ms, r.RestoreMaxMs, r.TotalPssMiB, r.SentryPssMiB, r.PerClonePssMiB)
	}
	haveLayers := false
	for _, r := range results {
		if r.Scenario != "layers" {
			continue
		}
		if !haveLayers {
			fmt.Printf("\n%-10s %-10s %9s %9s %12s %14s %14s\n", "scenario", "runtime", "layer_MiB", "park_ms", "restore_ms", "image_MiB", "snapshot_MiB")
			haveLayers = true
		}
		fmt.Printf("%-10s %-10s %9d %9.0f %12.0f %14.1f %14.1f\n", r.Scenario, r.Runtime, r.LayerMiB, r.CheckpointMs, r.RestoreP50Ms, mib(r.ImageBytes), mib(r.SnapshotBytes))
	}
	// Ratios, forkvisor over upstream.
	by := map[string]map[string]Result{}
	for _, r := range results {
		key := r.Scenario
		if r.Scenario == "layers" {
			key = fmt.Sprintf("layers%d", r.LayerMiB)
		}
		if by[key] == nil {
			by[key] = map[string]Result{}
		}
		by[key][r.Runtime] = r
	}
	fmt.Println()
	keys := []string{"clones256", "clones2g", "repark"}
	for _, r := range results {
		if r.Scenario == "layers" && r.Runtime == "upstream" {
			keys = append(keys, fmt.Sprintf("layers%d", r.LayerMiB))
		}
	}
	for _, s := range keys {
		u, okU := by[s]["upstream"]
		f, okF := by[s]["forkvisor"]
		if !okU || !okF {
			continue
		}
		line := fmt.Sprintf("%-10s forkvisor/upstream: checkpoint %.2fx, image %.3fx", s, f.CheckpointMs/u.CheckpointMs, float64(f.ImageBytes)/float64(u.ImageBytes))
		if u.TotalPssMiB > 0 {
			line += fmt.Sprintf(", total Pss %.2fx", f.TotalPssMiB/u.TotalPssMiB)
		}
		if u.RestoreP50Ms > 0 {
			line += fmt.Sprintf(", restore p50 %.2fx", f.RestoreP50Ms/u.RestoreP50Ms)
		}
		fmt.Println(line)
	}
	if a, okA := by["clones256"]["forkvisor"]; okA {
		if b, okB := by["clones2g"]["forkvisor"]; okB {
			fmt.Printf("forkvisor restore p50, 2 GiB over 256 MiB: %.2fx\n", b.RestoreP50Ms/a.RestoreP50Ms)
		}
	}
	var fl []Result
	for _, r := range results {
		if r.Scenario == "layers" && r.Runtime == "forkvisor" {
			fl = append(fl, r)
		}
	}
	if len(fl) >= 2 {
		lo, hi := fl[0], fl[len(fl)-1]
		fmt.Printf("forkvisor layers %d MiB over %d MiB: park %.2fx, restore %.2fx\n", hi.LayerMiB, lo.LayerMiB, hi.CheckpointMs/lo.CheckpointMs, hi.RestoreP50Ms/lo.RestoreP50Ms)
	}
}

// diskUsage returns the bytes allocated on disk by the files of dir, with and
// without base.img.
func diskUsage(dir string) (all, noBase int64) {
	entries, err := os.ReadDir(dir)
	must(err)
	for _, e := range entries {
		info, err := e.Info()
		must(err)
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		n := st.Blocks * 512
		all += n
		if e.Name() != "base.img" {
			noBase += n
		}
	}
	return all, noBase
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
func mib(b int64) float64        { return float64(b) / (1 << 20) }

func abs(p string) string {
	a, err := filepath.Abs(p)
	must(err)
	return a
}

func must(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

// cleanups tear down every runsc root the benchmark used.
var cleanups []func()

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "forkbench: "+format+"\n", args...)
	// Leave no sandbox behind.
	for _, c := range cleanups {
		c()
	}
	os.Exit(1)
}
