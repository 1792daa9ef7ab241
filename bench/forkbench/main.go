// Command forkbench measures shared-base clones side by side: upstream runsc
// (the same pin, unpatched) and forkvisor's runsc, the same workload on the
// same machine in one run. It prints a table and writes JSON.
//
// Scenarios (-scenarios, comma-separated):
//
//	clones256  park a 256 MiB tick workload, restore 8 clones
//	writer30   the same, but every tick stores into 30% of the heap's pages
//	           (scattered) before it prints, the first tick after restore too
//	writer100  the same with 100% of the pages
//	writerP    the same with P% of the pages, for each P of -writer-pcts
//	           (e.g. -writer-pcts 1,5,10,50: a sweep of write shares)
//	cpython    a CPython asyncio agent (200k small dicts, iterated every
//	           tick) in a Debian rootfs (tools/pyrootfs.sh), 4 clones
//	clones2g   park a 2 GiB tick workload, restore 2 clones
//	repark     park an unchanged clone again (after clones256)
//	layers     park and restore a sandbox with a writable layer (--overlay2
//	           filestore) of 64 MiB, 256 MiB and 1 GiB (-layer-sizes), on a
//	           loopback XFS; forkvisor keeps the layer out of the image
//	           (--skip-filestore-pages, --filestore-snapshot-dir) and adopts
//	           it on restore (--filestore-adopt-dir)
//	layers-dirty  the same, parked right after the layer is written (nothing
//	           flushed by the caller) with --leave-running: pause_ms is how
//	           long the save paused the sandbox (its debug log, both
//	           runtimes), freeze_ms the longest gap between its 20 ms ticks
//	           as they arrive
//	registry   park a 256 MiB tick workload on node A, push it to a registry
//	           on loopback (bin/forkvisor-oci), pull it on a cold node B and
//	           restore; park a clone of it again on A, push, pull on B
//	           (which holds the base by then) and restore. Upstream's plain
//	           checkpoint travels as one artifact of its files.
//	lazy       park a 1 GiB tick workload (-lazy-mib) on node A and push it;
//	           then restore it on A (forkvisor: learn, the first restore,
//	           which learns the write set; then warm, which applies it), on a cold node after a
//	           full pull (both runtimes; forkvisor verifies and stores the
//	           base), and on a cold node after `pull --lazy` with the node's
//	           lazy fetcher (forkvisor): pull, restore -> first tick, the
//	           first full pass over the heap, and the base bytes fetched
//	http       a stateful HTTP server (test/workloads/kvserver, 64 MiB heap) on
//	           gVisor's network stack, parked and restored as 4 clones, each
//	           in a network namespace of its own: restore -> first answered
//	           GET, and requests per second of the source and each clone
//	storage    a 256 MiB tick workload that stores into 1% of its pages per
//	           tick, parked, then 10 times restored, ticked and parked
//	           again: bytes on disk per park and for the whole lineage
//	dedup      4 instances holding the same 64 MiB (-dedup-mib), their total
//	           Pss sampled every 50 ms for 60 s (-dedup-seconds): upstream
//	           sandboxes (KSM on: it cannot merge them), forkvisor clones of
//	           one base (KSM off), plain processes under KSM, and plain
//	           processes with unique payloads under KSM (control)
//	density    idle clones of one parked 128 MiB (-density-mib) tick workload
//	           added one at a time until their total Pss passes 2 GiB
//	           (-density-budget-mib) or 64 run (-density-max): clones per GiB,
//	           per-clone memory by kind
//	burst      16 restores (-burst-n) of one parked 128 MiB (-burst-mib) tick
//	           workload started at once, by plain restores, into as
//	           many sandboxes created beforehand and (forkvisor) as resumes
//	           of as many clones restored paused beforehand: wall time,
//	           per-restore latency and sentry CPU, total Pss, the pool's
//	           Pss while it waits
//	verify     what verifying a base costs: a base of random data read per
//	           2 MiB block, faulted in (the floor) or faulted in and hashed,
//	           cold and warm page cache, and `runsc bases verify` of it
//	prestarted restore a parked 256 MiB tick workload by a plain restore and
//	           into a sandbox created beforehand (internal/warmpool: runsc
//	           create, then runsc restore of the created container), 8 of
//	           each per run, alternating
//	prestarted-cpython  the same with the CPython agent of cpython; it also
//	           prints each runtime against upstream's best p50, either way
//	flatten    N MemoryFiles restored from one delta-only checkpoint over one
//	           base in one process, for N in -flatten-n (pgalloc's
//	           TestSharedBaseFlatten; no sandbox): Rss, Pss, Private_Dirty
//
// Memory is Pss summed over every process of every clone sandbox (sentry,
// systrap stubs, gofer; each address space once) plus each sandbox's
// MemoryFile pages that no process maps (memstat: the fork's restore fills
// some with sendfile and pwrite), measured after every clone has read its
// whole heap. The JSON keeps the names *_pss_mib for these totals. Restore latency is the wall time from starting
// `runsc restore --detach` to the first line the workload prints after
// restore; the first clone of each run is reported apart (first_ms): for
// forkvisor it learns the base's write set, which later clones apply, and the
// benchmark lets it finish learning before restoring the next. Upstream is
// measured in both of its restore modes (plain, and
// --background as "upstream-bg"); ratios compare forkvisor with the better
// of the two. With -repeat N, runtimes alternate within each repetition.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/stats"
	"github.com/forkvisor/forkvisor/internal/teardown"
)

var (
	upstreamBin = flag.String("upstream", "bin/runsc-upstream", "upstream runsc")
	forkBin     = flag.String("fork", "bin/runsc", "forkvisor runsc")
	tickBin     = flag.String("tick", "bin/tick", "tick workload (static)")
	ociBin      = flag.String("oci", "bin/forkvisor-oci", "registry companion (registry scenario)")
	kvBin       = flag.String("kvserver", "bin/kvserver", "HTTP key-value workload (http scenario; static)")
	scenarios   = flag.String("scenarios", "clones256,writer30,writer100,cpython,repark,clones2g,layers,layers-dirty,registry,lazy,prestarted,prestarted-cpython,http,storage,burst,density,verify,dedup,flatten", "scenarios to run")
	densityMiB  = flag.Int("density-mib", 128, "heap of the density scenario's workload in MiB")
	densityMax  = flag.Int("density-max", 64, "most clones the density scenario restores")
	densityBudg = flag.Int("density-budget-mib", 2048, "total memory at which the density scenario stops adding clones")
	burstN      = flag.Int("burst-n", 16, "restores started at once in the burst scenario")
	burstMiB    = flag.Int("burst-mib", 128, "heap of the burst scenario's workload in MiB")
	lazyMiB     = flag.Int("lazy-mib", 1024, "heap of the lazy scenario's workload in MiB")
	dedupMiB    = flag.Int("dedup-mib", 64, "payload of each instance in MiB for the dedup scenario")
	dedupSecs   = flag.Int("dedup-seconds", 60, "how long the dedup scenario samples each group")
	verifyMiB   = flag.Int("verify-mib", 512, "base size in MiB for the verify scenario")
	flattenN    = flag.String("flatten-n", "1,2,4,8,16,32", "clone counts of the flatten scenario")
	writerPcts  = flag.String("writer-pcts", "", "more writer scenarios to run, one per percentage of the heap's pages stored into every tick (comma-separated, 1-100)")
	repeat      = flag.Int("repeat", 1, "runs per clone scenario and runtime, alternating runtimes (medians are reported)")
	layerSizes  = flag.String("layer-sizes", "64,256,1024", "writable layer sizes in MiB for the layers scenario")
	layerRepeat = flag.Int("layer-repeat", 3, "runs per layer size and runtime (medians are reported)")
	workDir     = flag.String("work", "", "work directory (default: a new temporary directory, removed afterwards)")
	jsonOut     = flag.String("json", "bench/out/forkbench.json", "where to write the JSON results")
	cold        = flag.Bool("cold", false, "clone scenarios: before each restore, write back and drop the page cache of every file of the image (fadvise DONTNEED, for every runtime alike; pages that running clones map stay cached)")
	logDir      = flag.String("log-dir", "", "if set, keep runsc debug logs (--debug) of every runtime and scenario under this directory; slows every runtime alike")
)

// Result is one runtime's numbers for one scenario.
type Result struct {
	Scenario string `json:"scenario"`
	Runtime  string `json:"runtime"`
	HeapMiB  int    `json:"heap_mib"`
	Clones   int    `json:"clones"`

	CheckpointMs     float64   `json:"checkpoint_ms"`
	ImageBytes       int64     `json:"image_bytes"`         // allocated on disk, all files of the image directory
	ImageBytesNoBase int64     `json:"image_bytes_no_base"` // the same, without base.img
	RestoreMs        []float64 `json:"restore_ms"`          // per clone: restore start -> first tick
	FirstRestoreMs   []float64 `json:"first_restore_ms"`    // per repeat: the first clone's (it learns the write set)
	RestoreP50Ms     float64   `json:"restore_p50_ms"`      // over the clones after the first
	RestoreMaxMs     float64   `json:"restore_max_ms"`
	// RestoreCPUMs is, per clone after the first, the CPU time its sentry
	// (the sandbox process, not its stubs) had used when its first tick
	// appeared: the runtime's own work for the restore.
	RestoreCPUMs    []float64 `json:"restore_cpu_ms,omitempty"`
	RestoreCPUP50Ms float64   `json:"restore_cpu_p50_ms,omitempty"`
	// PassMs is, per clone after the first, how long the workload's first
	// pass over its state after the restore took in the guest, as its first
	// output says (pyagent's pass_ms; none for workloads that do not say);
	// FirstPassMs is the same for the first clone of each repeat.
	PassMs      []float64 `json:"pass_ms,omitempty"`
	PassP50Ms   float64   `json:"pass_p50_ms,omitempty"`
	FirstPassMs []float64 `json:"first_pass_ms,omitempty"`

	TotalPssMiB    float64   `json:"total_pss_mib"`  // all processes of all clones: Pss plus unmapped MemoryFile pages
	SentryPssMiB   float64   `json:"sentry_pss_mib"` // sentries only, the same way
	TotalRssMiB    float64   `json:"total_rss_mib"`
	PerClonePssMiB float64   `json:"per_clone_pss_mib"`
	PssSamplesMiB  []float64 `json:"pss_samples_mib,omitempty"` // total Pss of each repeat
	// PssByKindMiB is the total memory by kind (memstat.Sandbox.ByKind: guest
	// memory file, with its unmapped pages, base, platform, anon, file) of
	// the last repeat.
	PssByKindMiB map[string]float64 `json:"pss_by_kind_mib,omitempty"`
	// UnmappedGuestMiB is the part of the guest kind, and of TotalPssMiB,
	// that is MemoryFile pages no process maps (memstat.Usage.Unmapped, from
	// the same measurement).
	UnmappedGuestMiB float64 `json:"unmapped_guest_mib,omitempty"`

	LayerMiB      int   `json:"layer_mib,omitempty"`
	Repeats       int   `json:"repeats,omitempty"`        // park_ms and restore p50 are medians over this many runs
	SnapshotBytes int64 `json:"snapshot_bytes,omitempty"` // allocated, exclusive of shared extents not counted

	// FreezeMs (layers-dirty) is the longest gap between the parked
	// sandbox's 20 ms ticks around a --leave-running park (median).
	FreezeMs        float64   `json:"freeze_ms,omitempty"`
	FreezeSamplesMs []float64 `json:"freeze_samples_ms,omitempty"`
	// PauseMs (layers-dirty) is how long the park paused the sandbox's
	// tasks, from the sandbox's debug log (internal/pauselog; median).
	PauseMs        float64   `json:"pause_ms,omitempty"`
	PauseSamplesMs []float64 `json:"pause_samples_ms,omitempty"`
}

// runtimeConfig is one way of running the same scenario: a runsc binary, the flags
// its checkpoint gets, and the flags its restores get.
type runtimeConfig struct {
	name        string
	bin         string
	fork        bool
	restoreArgs []string
}

// cloneScenario is a workload parked once and restored n times.
type cloneScenario struct {
	name     string
	heapMiB  int
	n        int
	checkMiB int
	args     []string // extra tick arguments
	// pyEntries, if not zero, runs the CPython agent (test/workloads/pyagent)
	// with that many entries instead of the tick workload.
	pyEntries int
}

var cloneScenarios = []cloneScenario{
	// Read-mostly: clones read their whole heap, write one page.
	{name: "clones256", heapMiB: 256, n: 8, checkMiB: 4},
	// Writers: every tick stores into 30% / 100% of the heap's pages in a
	// scattered order, the first tick after restore included.
	{name: "writer30", heapMiB: 256, n: 8, checkMiB: 4, args: []string{"-write-pct", "30"}},
	{name: "writer100", heapMiB: 256, n: 8, checkMiB: 4, args: []string{"-write-pct", "100"}},
	{name: "clones2g", heapMiB: 2048, n: 2, checkMiB: 4},
	// CPython 3.11 asyncio agent in a Debian rootfs: a dict of 200k small
	// dicts that every tick iterates (reference counts: writes all over
	// the heap), 4 clones.
	{name: "cpython", n: 4, pyEntries: 200000},
}

func main() {
	flag.Parse()
	want := map[string]bool{}
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.TrimSpace(s)
		if s == "" && *writerPcts != "" {
			continue // -scenarios '' -writer-pcts ...: the sweep alone
		}
		if !knownScenario(s) {
			fatalf("unknown scenario %q (-scenarios): see the list at the top of bench/forkbench/main.go", s)
		}
		want[s] = true
	}
	if *writerPcts != "" {
		for _, p := range intList(*writerPcts) {
			if p < 1 || p > 100 {
				fatalf("-writer-pcts: %d is not a percentage from 1 to 100", p)
			}
			name := fmt.Sprintf("writer%d", p)
			if !slices.ContainsFunc(cloneScenarios, func(sc cloneScenario) bool { return sc.name == name }) {
				cloneScenarios = append(cloneScenarios, cloneScenario{name: name, heapMiB: 256, n: 8, checkMiB: 4, args: []string{"-write-pct", fmt.Sprint(p)}})
			}
			want[name] = true
		}
	}
	// Every scenario but flatten runs sandboxes.
	sandboxes := len(want) > 1 || !want["flatten"]
	if sandboxes && os.Geteuid() != 0 {
		fatalf("forkbench needs root to run sandboxes")
	}
	// Ctrl-C or SIGTERM tears down every sandbox, mount and loop device the
	// benchmark started, like a failure does.
	teardown.OnInterrupt("forkbench")
	for _, p := range []string{*upstreamBin, *forkBin, *tickBin} {
		if _, err := os.Stat(p); err != nil && sandboxes {
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
		addCleanup(func() { os.RemoveAll(dir) })
	}
	// Upstream restores in both of its modes: plain (every page loaded
	// before the workload runs) and --background (pages load while it runs).
	runtimes := []runtimeConfig{
		{name: "upstream", bin: abs(*upstreamBin)},
		{name: "upstream-bg", bin: abs(*upstreamBin), restoreArgs: []string{"--background"}},
		{name: "forkvisor", bin: abs(*forkBin), fork: true},
	}

	var results []Result
	for _, sc := range cloneScenarios {
		repark := sc.name == "clones256" && want["repark"]
		if !want[sc.name] && !repark {
			continue
		}
		byRT := map[string][]Result{}
		var reparks []Result
		// Alternate runtimes within each repetition.
		for i := 0; i < *repeat; i++ {
			for _, rt := range runtimes {
				fmt.Fprintf(os.Stderr, "forkbench: %s, %s, run %d/%d\n", sc.name, rt.name, i+1, *repeat)
				res, rp := clones(filepath.Join(dir, fmt.Sprint(i)), rt, sc, repark && rt.name != "upstream-bg")
				byRT[rt.name] = append(byRT[rt.name], res)
				if rp != nil {
					reparks = append(reparks, *rp)
				}
			}
		}
		if want[sc.name] {
			for _, rt := range runtimes {
				results = append(results, mergeRuns(byRT[rt.name]))
			}
		}
		results = append(results, reparks...)
	}
	if want["layers"] {
		// The layer scenario restores eagerly in both runtimes.
		results = append(results, layers(dir, []runtimeConfig{runtimes[0], runtimes[2]}, false)...)
	}
	if want["layers-dirty"] {
		results = append(results, layers(dir, []runtimeConfig{runtimes[0], runtimes[2]}, true)...)
	}
	var fleetResults []FleetResult
	if want["registry"] {
		fleetResults = fleet(dir, []runtimeConfig{runtimes[0], runtimes[2]}, 256)
	}
	var lazyResults []LazyResult
	if want["lazy"] {
		lazyResults = lazyRestores(dir, runtimes, *lazyMiB)
	}
	var prestartResults []PrestartResult
	if want["prestarted"] {
		prestartResults = prestarted(dir, runtimes, tickPrestart(256))
	}
	if want["prestarted-cpython"] {
		prestartResults = append(prestartResults, prestarted(dir, runtimes, cpythonPrestart())...)
	}
	var httpResults []HTTPResult
	if want["http"] {
		httpResults = httpClones(dir, runtimes, abs(*kvBin))
	}
	var storageResults []StorageResult
	if want["storage"] {
		storageResults = storage(dir, []runtimeConfig{runtimes[0], runtimes[2]})
	}
	var burstResults []BurstResult
	if want["burst"] {
		burstResults = burst(dir, runtimes, *burstN, *burstMiB)
	}
	var densityResults []DensityResult
	if want["density"] {
		densityResults = density(dir, []runtimeConfig{runtimes[0], runtimes[2]}, *densityMiB, *densityBudg, *densityMax)
	}
	var verifyResults []VerifyResult
	var verifyRuns []VerifyRun
	if want["verify"] {
		verifyResults, verifyRuns = verifyCost(dir, runtimes[2], *verifyMiB)
	}
	var dedupResults []DedupResult
	if want["dedup"] {
		dedupResults = dedup(dir, []runtimeConfig{runtimes[0], runtimes[2]}, 4, *dedupMiB, time.Duration(*dedupSecs)*time.Second)
	}
	var flattenResults []FlattenResult
	if want["flatten"] {
		flattenResults = flatten(dir, intList(*flattenN))
	}
	printTable(results)
	printFlatten(flattenResults)
	printFleet(fleetResults)
	printLazy(lazyResults)
	printStorage(storageResults)
	printPrestarted(prestartResults)
	printHTTP(httpResults)
	printBurst(burstResults)
	printDensity(densityResults)
	printVerify(verifyResults, verifyRuns)
	printDedup(dedupResults)
	if *jsonOut != "" {
		if err := os.MkdirAll(filepath.Dir(*jsonOut), 0o755); err == nil {
			b, _ := json.MarshalIndent(map[string]any{
				"date":       time.Now().UTC().Format(time.RFC3339),
				"conditions": conditions(),
				"results":    results,
				"registry":   fleetResults,
				"lazy":       lazyResults,
				"prestarted": prestartResults,
				"http":       httpResults,
				"storage":    storageResults,
				"verify":     map[string]any{"blocks": verifyResults, "runsc": verifyRuns},
				"dedup":      dedupResults,
				"burst":      burstResults,
				"density":    densityResults,
				"flatten":    flattenResults,
			}, "", "  ")
			if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
				fatalf("%v", err)
			}
			fmt.Printf("\nJSON: %s\n", *jsonOut)
		}
	}
}

// mergeRuns folds the repeats of one scenario and runtime into one Result:
// every restore sample is kept, and checkpoint time and memory are medians.
func mergeRuns(runs []Result) Result {
	res := runs[len(runs)-1]
	res.RestoreMs = nil
	res.FirstRestoreMs = nil
	res.RestoreCPUMs = nil
	res.PassMs, res.FirstPassMs = nil, nil
	var ckpt, pss, sentry, rss []float64
	for _, r := range runs {
		res.RestoreMs = append(res.RestoreMs, r.RestoreMs...)
		res.FirstRestoreMs = append(res.FirstRestoreMs, r.FirstRestoreMs...)
		res.RestoreCPUMs = append(res.RestoreCPUMs, r.RestoreCPUMs...)
		res.PassMs = append(res.PassMs, r.PassMs...)
		res.FirstPassMs = append(res.FirstPassMs, r.FirstPassMs...)
		ckpt = append(ckpt, r.CheckpointMs)
		pss = append(pss, r.TotalPssMiB)
		sentry = append(sentry, r.SentryPssMiB)
		rss = append(rss, r.TotalRssMiB)
	}
	res.CheckpointMs = median(ckpt)
	res.TotalPssMiB, res.SentryPssMiB, res.TotalRssMiB = median(pss), median(sentry), median(rss)
	res.PerClonePssMiB = res.TotalPssMiB / float64(res.Clones)
	res.PssSamplesMiB = pss
	res.RestoreP50Ms, res.RestoreMaxMs = median(res.RestoreMs), maxOf(res.RestoreMs)
	res.RestoreCPUP50Ms = median(res.RestoreCPUMs)
	res.PassP50Ms = median(res.PassMs)
	res.Repeats = len(runs)
	return res
}

// clones parks the scenario's workload and restores sc.n clones from it.
func clones(dir string, rt runtimeConfig, sc cloneScenario, repark bool) (Result, *Result) {
	base := filepath.Join(dir, sc.name+"-"+rt.name)
	r := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root"), Upstream: !rt.fork, LogDir: runtimeLogDir(sc.name, rt)}
	addCleanup(r.Cleanup)
	// Deferred in this order so that the sandboxes go before their root.
	defer os.RemoveAll(base)
	defer r.Cleanup()
	bundle := filepath.Join(base, "bundle")
	// fullPass is the number of ticks after the first in which every clone
	// has read (or, for the agent, walked) its whole heap.
	fullPass := 3
	if sc.pyEntries > 0 {
		must(pyAgentBundle(bundle, sc.pyEntries))
	} else {
		args := append([]string{"-mib", fmt.Sprint(sc.heapMiB), "-interval", "50ms", "-check-mib", fmt.Sprint(sc.checkMiB)}, sc.args...)
		must(sandbox.NewBundle(bundle, abs(*tickBin), args...))
		fullPass = sc.heapMiB/sc.checkMiB + 2
	}
	_, err := r.RunUntilTick(bundle, "source", filepath.Join(base, "source.out"), 2, nil)
	must(err)

	res := Result{Scenario: sc.name, Runtime: rt.name, HeapMiB: sc.heapMiB, Clones: sc.n}
	image := filepath.Join(base, "image")
	var flags []string
	if rt.fork {
		flags = append(flags, "--shared-base")
	}
	start := time.Now()
	must(r.Checkpoint("source", image, flags...))
	res.CheckpointMs = ms(time.Since(start))
	r.Destroy("source")
	res.ImageBytes, res.ImageBytesNoBase = diskUsage(image)

	var ids []string
	var outs []string
	for i := 0; i < sc.n; i++ {
		id := fmt.Sprintf("clone%d", i)
		out := filepath.Join(base, id+".out")
		if *cold {
			dropImageCache(image)
		}
		tk, took, err := r.RestoreFirstTick(bundle, id, image, out, rt.restoreArgs...)
		must(err)
		// A pass longer than the restore itself began before the
		// checkpoint paused the workload (the guest's monotonic clock
		// jumps by the time the sandbox was parked): not this restore's.
		passMs := tk.PassMs
		if passMs > ms(took) {
			passMs = 0
		}
		if i == 0 {
			if passMs > 0 {
				res.FirstPassMs = append(res.FirstPassMs, passMs)
			}
			// The first restore of a base learns its write set (forkvisor);
			// report it apart, for every runtime, and let the learning
			// finish before the next clone, as it would for clones that
			// come later in a fleet's life.
			res.FirstRestoreMs = append(res.FirstRestoreMs, ms(took))
			if rt.fork {
				if err := sandbox.WaitWriteSet(r.WriteSetPath(image), 15*time.Second); err != nil {
					fmt.Fprintf(os.Stderr, "forkbench: %v\n", err)
				}
			}
		} else {
			res.RestoreMs = append(res.RestoreMs, ms(took))
			if passMs > 0 {
				res.PassMs = append(res.PassMs, passMs)
			}
			if cpu, err := r.SentryCPU(id); err == nil {
				res.RestoreCPUMs = append(res.RestoreCPUMs, ms(cpu))
			} else {
				fmt.Fprintf(os.Stderr, "forkbench: %v\n", err)
			}
		}
		ids = append(ids, id)
		outs = append(outs, out)
	}
	res.RestoreP50Ms, res.RestoreMaxMs = median(res.RestoreMs), maxOf(res.RestoreMs)
	res.RestoreCPUP50Ms = median(res.RestoreCPUMs)
	res.PassP50Ms = median(res.PassMs)

	// Let every clone read its whole heap, then measure.
	for _, out := range outs {
		first, _, err := sandbox.WaitForLine(out, 0, 10*time.Second, sandbox.IsTick)
		must(err)
		ft, _ := sandbox.ParseTick(first)
		line, _, err := sandbox.WaitForLine(out, 0, 300*time.Second, func(l string) bool {
			tk, err := sandbox.ParseTick(l)
			return err == nil && (tk.N >= ft.N+fullPass || !tk.OK)
		})
		must(err)
		if tk, _ := sandbox.ParseTick(line); !tk.OK {
			fatalf("%s %s: clone heap corrupt: %s", rt.name, sc.name, line)
		}
	}
	m, err := r.Memory(ids...)
	must(err)
	all, sentries := m.All, m.Sentries
	res.TotalPssMiB = float64(all.Total()) / 1024
	res.TotalRssMiB = float64(all.Rss) / 1024
	res.SentryPssMiB = float64(sentries.Total()) / 1024
	res.PerClonePssMiB = res.TotalPssMiB / float64(sc.n)
	res.PssByKindMiB = kindsMiB(m.ByKind, 1)
	res.UnmappedGuestMiB = float64(all.Unmapped) / 1024

	var reparkRes *Result
	if repark {
		rp := Result{Scenario: "repark", Runtime: rt.name, HeapMiB: sc.heapMiB, Clones: 1}
		image2 := filepath.Join(base, "image-repark")
		start := time.Now()
		must(r.Checkpoint(ids[0], image2, flags...))
		rp.CheckpointMs = ms(time.Since(start))
		rp.ImageBytes, rp.ImageBytesNoBase = diskUsage(image2)
		reparkRes = &rp
	}
	for _, id := range ids {
		r.Destroy(id)
	}
	return res, reparkRes
}

func printTable(results []Result) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\n%-10s %-11s %5s %6s %8s %10s %12s %9s %8s %8s %8s %10s %10s %9s\n",
		"scenario", "runtime", "heap", "clones", "ckpt_ms", "image_MiB", "img-base_MiB", "first_ms", "rst_p50", "rst_max", "rst_cpu", "total_MiB", "sentry_MiB", "MiB/clone")
	for _, r := range results {
		if r.Scenario == "layers" || r.Scenario == "layers-dirty" {
			continue
		}
		fmt.Printf("%-10s %-11s %5d %6d %8.0f %10.1f %12.1f %9.0f %8.0f %8.0f %8.0f %10.1f %10.1f %9.1f\n",
			r.Scenario, r.Runtime, r.HeapMiB, r.Clones, r.CheckpointMs, mib(r.ImageBytes), mib(r.ImageBytesNoBase),
			median(r.FirstRestoreMs), r.RestoreP50Ms, r.RestoreMaxMs, r.RestoreCPUP50Ms, r.TotalPssMiB, r.SentryPssMiB, r.PerClonePssMiB)
	}
	haveKinds := false
	for _, r := range results {
		if len(r.PssByKindMiB) == 0 {
			continue
		}
		if !haveKinds {
			fmt.Printf("\n%-10s %-11s %10s %10s %10s %10s %10s %10s  (total memory by kind, MiB, last repeat; unmapped: guest pages no process maps, in guest)\n", "scenario", "runtime",
				memstat.KindGuest, memstat.KindBase, memstat.KindPlatform, memstat.KindAnon, memstat.KindFile, "unmapped")
			haveKinds = true
		}
		fmt.Printf("%-10s %-11s %s %10.1f\n", r.Scenario, r.Runtime, kindColumns(r.PssByKindMiB), r.UnmappedGuestMiB)
	}
	haveLayers := false
	for _, r := range results {
		if r.Scenario != "layers" && r.Scenario != "layers-dirty" {
			continue
		}
		if !haveLayers {
			fmt.Printf("\n%-12s %-10s %9s %9s %9s %9s %12s %14s %14s\n", "scenario", "runtime", "layer_MiB", "park_ms", "pause_ms", "freeze_ms", "restore_ms", "image_MiB", "snapshot_MiB")
			haveLayers = true
		}
		fmt.Printf("%-12s %-10s %9d %9.0f %9.0f %9.0f %12.0f %14.1f %14.1f\n", r.Scenario, r.Runtime, r.LayerMiB, r.CheckpointMs, r.PauseMs, r.FreezeMs, r.RestoreP50Ms, mib(r.ImageBytes), mib(r.SnapshotBytes))
	}
	// The workload's own first pass after restore, where it says.
	havePass := false
	for _, r := range results {
		if len(r.PassMs) == 0 {
			continue
		}
		if !havePass {
			fmt.Println()
			havePass = true
		}
		fmt.Printf("%-10s %-11s first pass over the state after restore, in the guest: p50 %.0f ms (%d clones), first clone %s ms\n",
			r.Scenario, r.Runtime, r.PassP50Ms, len(r.PassMs), joinMs(r.FirstPassMs))
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
	keys := []string{}
	for _, sc := range cloneScenarios {
		keys = append(keys, sc.name)
	}
	keys = append(keys, "repark")
	for _, r := range results {
		if r.Scenario == "layers" && r.Runtime == "upstream" {
			keys = append(keys, fmt.Sprintf("layers%d", r.LayerMiB))
		}
	}
	for _, s := range keys {
		f, okF := by[s]["forkvisor"]
		u, okU := by[s]["upstream"]
		if !okU || !okF {
			continue
		}
		// The checkpoint against the faster of upstream's two (the same
		// command: its two rows differ only in how they restore).
		uckpt := u.CheckpointMs
		if bg, ok := by[s]["upstream-bg"]; ok && bg.CheckpointMs > 0 && bg.CheckpointMs < uckpt {
			uckpt = bg.CheckpointMs
		}
		line := fmt.Sprintf("%-10s forkvisor/upstream: checkpoint %.2fx, image %.3fx", s, f.CheckpointMs/uckpt, float64(f.ImageBytes)/float64(u.ImageBytes))
		// Compare with upstream's better restore mode, for latency and
		// memory separately.
		best := u
		if bg, ok := by[s]["upstream-bg"]; ok {
			if bg.RestoreP50Ms < best.RestoreP50Ms {
				best.RestoreP50Ms = bg.RestoreP50Ms
			}
			if bg.TotalPssMiB < best.TotalPssMiB {
				best.TotalPssMiB = bg.TotalPssMiB
			}
		}
		if best.TotalPssMiB > 0 {
			line += fmt.Sprintf(", total memory %.2fx", f.TotalPssMiB/best.TotalPssMiB)
		}
		if best.RestoreP50Ms > 0 {
			line += fmt.Sprintf(", restore p50 %.2fx", f.RestoreP50Ms/best.RestoreP50Ms)
		}
		if uf, ff := median(u.FirstRestoreMs), median(f.FirstRestoreMs); uf > 0 {
			if bg, ok := by[s]["upstream-bg"]; ok && len(bg.FirstRestoreMs) > 0 {
				uf = min(uf, median(bg.FirstRestoreMs))
			}
			line += fmt.Sprintf(", first restore %.2fx", ff/uf)
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

func median(v []float64) float64 { return stats.Median(v) }

// joinMs formats samples in milliseconds, comma-separated.
func joinMs(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(parts, ", ")
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// medianBy returns the median of get over runs.
func medianBy[T any](runs []T, get func(T) float64) float64 {
	v := make([]float64, 0, len(runs))
	for _, r := range runs {
		v = append(v, get(r))
	}
	return median(v)
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

// addCleanup registers c to tear down a runsc root, mount or temporary
// directory of the benchmark if it dies (fatalf, Ctrl-C or SIGTERM).
func addCleanup(c func()) { teardown.Add(c) }

// pyAgentBundle writes the CPython agent's bundle, with entries entries and
// 100 ms ticks, into dir (scenarios cpython and prestarted-cpython).
func pyAgentBundle(dir string, entries int) error {
	return sandbox.NewPyAgentBundle(dir, abs("."), entries, 100*time.Millisecond)
}

// knownScenario reports whether name is a scenario that forkbench runs:
// one of -scenarios' default, which lists them all.
func knownScenario(name string) bool {
	for _, s := range strings.Split(flag.Lookup("scenarios").DefValue, ",") {
		if s == name {
			return true
		}
	}
	return false
}

func fatalf(format string, args ...any) { teardown.Fatalf("forkbench", format, args...) }

// runtimeLogDir returns the debug log directory of rt in scenario, under
// -log-dir, or "" without it.
func runtimeLogDir(scenario string, rt runtimeConfig) string {
	if *logDir == "" {
		return ""
	}
	d := filepath.Join(abs(*logDir), scenario+"-"+rt.name)
	must(os.MkdirAll(d, 0o755))
	return d
}
