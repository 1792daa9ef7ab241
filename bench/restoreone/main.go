// Command restoreone measures restore -> first tick of clones restored one
// at a time, with nothing else running, for one or more runsc builds side
// by side. For each build it parks a tick workload (-mib of heap; with
// -write-pct, every tick stores into that share of its heap's pages, in a
// scattered order, before it prints, the first tick after a restore too),
// or with -cpython the CPython agent of forkbench's cpython scenario
// (test/workloads/pyagent, that many entries; its first line after a
// restore follows a whole pass over its state), then restores N+1 clones
// of each image, alternating between builds and modes, and destroys each
// clone once it has printed its first tick (the agent: its third, so that
// the pass of a clone that no restore slows down is printed too).
//
// A build that has `checkpoint --shared-base` parks with it, into a node
// base store of its own; its first restore learns the base's write set, so
// it is reported apart, and its clone is destroyed only once the set is
// written (off the clock), as for clones that come later in a fleet's life.
// A build without it (upstream) parks plainly and restores in both of its
// modes, plain and --background.
//
// It prints, per build and mode, the first restore, the median of the other
// N and every sample (ms); with -cpython also the agent's pass_ms of the
// first pass after the restore and of the third, and the CPU time and host
// page faults of the sandbox's systrap stubs (the processes that run the
// guest's code) up to the first tick and per later pass. With -log-dir it keeps runsc's debug logs, one
// directory per build and mode, for bench/restorephases:
//
//	go run ./bench/restoreone -write-pct 100 -n 5 bin/runsc-upstream bin/runsc
//	go run ./bench/restoreone -n 10 -log-dir /tmp/rl /tmp/runsc-before bin/runsc
//	go run ./bench/restorephases /tmp/rl/*
//
// Root; bin/tick must be built (make all). Sandboxes run under a temporary
// work directory (their --root and --base-store), removed at the end.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/stats"
	"github.com/forkvisor/forkvisor/internal/teardown"
)

var (
	writePct = flag.Int("write-pct", 0, "percent of the heap's pages each tick stores into (0-100)")
	n        = flag.Int("n", 10, "restores per build and mode after the first")
	heapMiB  = flag.Int("mib", 256, "heap of the tick workload in MiB")
	tickBin  = flag.String("tick", "bin/tick", "tick workload (static)")
	logDir   = flag.String("log-dir", "", "if set, keep runsc debug logs (--debug) under DIR/<build>-<mode>; slows every build alike")
	cpython  = flag.Int("cpython", 0, "if not 0, park the CPython agent with this many entries instead of the tick workload")
)

// runtime is one build restored in one mode.
type runtime struct {
	label   string // the build's path as given
	mode    string // shared-base, plain or background
	r       *sandbox.Runsc
	image   string
	fork    bool
	restore []string // extra restore flags
	samples []time.Duration
	// firstPass and laterPass are the agent's pass_ms (-cpython) of each
	// clone's first pass after the restore and of its third.
	firstPass, laterPass []float64
	// guestAtFirst is what the sandbox's processes other than the sentry
	// (the systrap stubs, which run the guest's code) had cost when the
	// first tick appeared; guestPerPass what they cost per pass between
	// the first tick and the third.
	guestAtFirst, guestPerPass []sandbox.ProcStat
}

func fatalf(format string, args ...any) { teardown.Fatalf("restoreone", format, args...) }

func main() {
	flag.Parse()
	if flag.NArg() == 0 || *writePct < 0 || *writePct > 100 || *n < 1 {
		fmt.Fprintln(os.Stderr, "usage: restoreone [-write-pct 0-100] [-n N>=1] [-mib MiB] [-cpython ENTRIES] [-tick BIN] [-log-dir DIR] RUNSC...")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fatalf("needs root to run sandboxes")
	}
	work, err := os.MkdirTemp("", "restoreone-")
	if err != nil {
		fatalf("%v", err)
	}
	teardown.Add(func() { os.RemoveAll(work) })
	teardown.OnInterrupt("restoreone")

	bundle := filepath.Join(work, "bundle")
	workload := fmt.Sprintf("%d MiB heap, write-pct %d", *heapMiB, *writePct)
	if *cpython > 0 {
		workload = fmt.Sprintf("CPython agent, %d entries", *cpython)
		if err := sandbox.NewPyAgentBundle(bundle, ".", *cpython, 100*time.Millisecond); err != nil {
			fatalf("%v (run from the repository, after `make pyrootfs`)", err)
		}
	} else {
		tick, err := filepath.Abs(*tickBin)
		if err != nil {
			fatalf("%v", err)
		}
		if _, err := os.Stat(tick); err != nil {
			fatalf("%v (run `make all` first)", err)
		}
		args := []string{"-mib", fmt.Sprint(*heapMiB), "-interval", "50ms"}
		if *writePct > 0 {
			args = append(args, "-write-pct", fmt.Sprint(*writePct))
		}
		if err := sandbox.NewBundle(bundle, tick, args...); err != nil {
			fatalf("%v", err)
		}
	}

	var runtimes []*runtime
	for i, label := range flag.Args() {
		bin, err := exec.LookPath(label)
		if err != nil {
			fatalf("%s: %v", label, err)
		}
		if bin, err = filepath.Abs(bin); err != nil {
			fatalf("%v", err)
		}
		help, _ := exec.Command(bin, "checkpoint", "--help").CombinedOutput()
		fork := strings.Contains(string(help), "-shared-base")
		modes := []string{"plain", "background"}
		if fork {
			modes = []string{"shared-base"}
		}
		root := filepath.Join(work, fmt.Sprintf("root%d", i))
		image := filepath.Join(work, fmt.Sprintf("image%d", i))
		var first *runtime
		for _, mode := range modes {
			rt := &runtime{label: label, mode: mode, image: image, fork: fork,
				r: &sandbox.Runsc{Bin: bin, Root: root, Upstream: !fork}}
			if *logDir != "" {
				rt.r.LogDir = filepath.Join(*logDir, fmt.Sprintf("%d-%s-%s", i, filepath.Base(label), mode))
				if err := os.MkdirAll(rt.r.LogDir, 0o755); err != nil {
					fatalf("%v", err)
				}
			}
			if mode == "background" {
				rt.restore = []string{"--background"}
			}
			teardown.Add(rt.r.Cleanup)
			runtimes = append(runtimes, rt)
			if first == nil {
				first = rt
			}
		}
		park(first, bundle, filepath.Join(work, fmt.Sprintf("source%d.out", i)))
	}

	for k := 0; k <= *n; k++ {
		for _, rt := range runtimes {
			id := fmt.Sprintf("c%d-%s", k, rt.mode)
			out := filepath.Join(work, fmt.Sprintf("%s-%s.out", filepath.Base(rt.r.Root), id))
			first, took, err := rt.r.RestoreFirstTick(bundle, id, rt.image, out, rt.restore...)
			if err != nil {
				fatalf("%s (%s), clone %d: %v", rt.label, rt.mode, k, err)
			}
			rt.samples = append(rt.samples, took)
			if *cpython > 0 {
				pid, err := rt.r.SandboxPID(id)
				if err != nil {
					fatalf("%s (%s), clone %d: %v", rt.label, rt.mode, k, err)
				}
				atFirst := guestCost(pid)
				later, _, err := sandbox.WaitTick(out, 0, 60*time.Second, func(t sandbox.Tick) bool { return t.N >= first.N+2 })
				if err != nil {
					fatalf("%s (%s), clone %d: %v", rt.label, rt.mode, k, err)
				}
				atLater := guestCost(pid)
				rt.guestAtFirst = append(rt.guestAtFirst, atFirst)
				rt.guestPerPass = append(rt.guestPerPass, sandbox.ProcStat{
					UserCPU:     (atLater.UserCPU - atFirst.UserCPU) / 2,
					CPU:         (atLater.CPU - atFirst.CPU) / 2,
					MinorFaults: (atLater.MinorFaults - atFirst.MinorFaults) / 2,
					MajorFaults: (atLater.MajorFaults - atFirst.MajorFaults) / 2,
				})
				// A pass longer than the restore began before the park
				// (the guest's monotonic clock jumps by the time the
				// sandbox was parked): not this restore's, as in forkbench.
				if first.PassMs <= ms(took) {
					rt.firstPass = append(rt.firstPass, first.PassMs)
				}
				rt.laterPass = append(rt.laterPass, later.PassMs)
			}
			if k == 0 && rt.fork {
				// runsc ignores a set that is still being learned.
				if err := sandbox.WaitWriteSet(rt.r.WriteSetPath(rt.image), 15*time.Second); err != nil {
					fatalf("%s: the first clone learned no write set: %v", rt.label, err)
				}
			}
			rt.r.Destroy(id)
		}
	}

	fmt.Printf("restore -> first tick, one clone at a time, %s (ms; first restore, then the median and samples of the other %d)\n", workload, *n)
	var dirs []string
	for _, rt := range runtimes {
		rest := make([]float64, 0, len(rt.samples)-1)
		for _, d := range rt.samples[1:] {
			rest = append(rest, ms(d))
		}
		samples := strings.Trim(fmt.Sprint(rest), "[]")
		fmt.Printf("%-40s %-12s first %6.0f  p50 %8.1f  samples %s\n", rt.label, rt.mode, ms(rt.samples[0]), median(rest), samples)
		if len(rt.laterPass) > 0 {
			fmt.Printf("%-40s %-12s pass_ms of the first pass after restore: p50 %.1f of %d (passes begun before the park left out); of the third: p50 %.1f, samples %v\n", rt.label, rt.mode, median(rt.firstPass), len(rt.firstPass), median(rt.laterPass), rt.laterPass)
			fmt.Printf("%-40s %-12s stubs (the guest's code): at the first tick %s; per later pass %s (p50s)\n", rt.label, rt.mode, costP50(rt.guestAtFirst), costP50(rt.guestPerPass))
		}
		if rt.r.LogDir != "" {
			dirs = append(dirs, rt.r.LogDir)
		}
	}
	if len(dirs) > 0 {
		fmt.Printf("phases: go run ./bench/restorephases %s\n", strings.Join(dirs, " "))
	}
	teardown.Run()
}

// park runs the workload with rt's build until its first tick and parks it
// into rt.image (with --shared-base on the fork).
func park(rt *runtime, bundle, out string) {
	// The source logs nothing into the restores' log directory.
	r := *rt.r
	r.LogDir = ""
	if _, err := r.RunUntilTick(bundle, "source", out, 1, nil); err != nil {
		fatalf("%s: the source printed no tick: %v", rt.label, err)
	}
	var flags []string
	if rt.fork {
		flags = []string{"--shared-base"}
	}
	if err := r.Checkpoint("source", rt.image, flags...); err != nil {
		fatalf("%s: %v", rt.label, err)
	}
	r.Destroy("source")
}

// guestCost sums the costs so far of the processes under the sandbox
// process pid, the sentry, which are its systrap stubs. A stub that exited
// between two calls takes its costs with it, so a difference of two calls
// can undercount.
func guestCost(pid int) sandbox.ProcStat {
	var sum sandbox.ProcStat
	for _, p := range memstat.Descendants(pid) {
		if p == pid {
			continue
		}
		st, err := sandbox.ReadProcStat(p)
		if err != nil {
			continue // exited
		}
		sum.UserCPU += st.UserCPU
		sum.CPU += st.CPU
		sum.MinorFaults += st.MinorFaults
		sum.MajorFaults += st.MajorFaults
	}
	return sum
}

// costP50 prints the medians of costs, field by field.
func costP50(costs []sandbox.ProcStat) string {
	var user, cpu, minflt []float64
	for _, c := range costs {
		user = append(user, ms(c.UserCPU))
		cpu = append(cpu, ms(c.CPU))
		minflt = append(minflt, float64(c.MinorFaults))
	}
	return fmt.Sprintf("CPU %.0f ms (user %.0f ms), %.0f host minor faults", median(cpu), median(user), median(minflt))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(v []float64) float64 { return stats.Median(v) }
