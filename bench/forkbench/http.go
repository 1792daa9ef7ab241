package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkvisor/forkvisor/internal/kvclient"
	"github.com/forkvisor/forkvisor/internal/netns"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// HTTPResult is one runtime's numbers for the http scenario: a stateful
// HTTP server (test/workloads/kvserver) on gVisor's network stack, parked
// and restored as clones, each in a network namespace of its own.
type HTTPResult struct {
	Runtime string `json:"runtime"`
	Clones  int    `json:"clones"`

	// FirstResponseMs is, per clone, `runsc restore` start → the first
	// successful GET of the inherited state from the clone's address.
	FirstResponseMs []float64 `json:"first_response_ms"`
	// SourceRPS and CloneRPS are sequential keep-alive GETs per second
	// over one second (the source before it is parked; each clone after
	// its first response); the latencies are per request.
	SourceRPS      float64   `json:"source_rps"`
	CloneRPS       []float64 `json:"clone_rps"`
	SourceP50Us    float64   `json:"source_p50_us"`
	SourceP99Us    float64   `json:"source_p99_us"`
	CloneP50Us     []float64 `json:"clone_p50_us"`
	CloneP99Us     []float64 `json:"clone_p99_us"`
	FirstRespP50Ms float64   `json:"first_response_p50_ms"`
	CloneRPSP50    float64   `json:"clone_rps_p50"`
}

// httpClones runs the http scenario for each runtime, -repeat times.
func httpClones(dir string, runtimes []runtimeConfig, kvBin string) []HTTPResult {
	const clones = 4
	var out []HTTPResult
	for _, rt := range runtimes {
		res := HTTPResult{Runtime: rt.name, Clones: clones}
		var srcRPS, srcP50, srcP99 []float64
		for i := 0; i < *repeat; i++ {
			fmt.Fprintf(os.Stderr, "forkbench: http, %s, run %d/%d\n", rt.name, i+1, *repeat)
			r := httpRun(filepath.Join(dir, fmt.Sprintf("http-%s-%d", rt.name, i)), rt, kvBin, clones)
			srcRPS, srcP50, srcP99 = append(srcRPS, r.SourceRPS), append(srcP50, r.SourceP50Us), append(srcP99, r.SourceP99Us)
			res.FirstResponseMs = append(res.FirstResponseMs, r.FirstResponseMs...)
			res.CloneRPS = append(res.CloneRPS, r.CloneRPS...)
			res.CloneP50Us = append(res.CloneP50Us, r.CloneP50Us...)
			res.CloneP99Us = append(res.CloneP99Us, r.CloneP99Us...)
		}
		res.SourceRPS, res.SourceP50Us, res.SourceP99Us = median(srcRPS), median(srcP50), median(srcP99)
		res.FirstRespP50Ms, res.CloneRPSP50 = median(res.FirstResponseMs), median(res.CloneRPS)
		out = append(out, res)
	}
	return out
}

func httpRun(base string, rt runtimeConfig, kvBin string, clones int) HTTPResult {
	r := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root"), Upstream: !rt.fork, Network: "sandbox", LogDir: runtimeLogDir("http", rt)}
	addCleanup(r.Cleanup)
	// Deferred in this order so that the sandboxes go before their root.
	defer os.RemoveAll(base)
	defer r.Cleanup()
	tag := fmt.Sprintf("fb%d", os.Getpid()%100000)
	newNS := func(k int) *netns.NS {
		ns, err := netns.Create(fmt.Sprintf("%s-%d", tag, k), fmt.Sprintf("%sh%d", tag, k), 100+k)
		must(err)
		addCleanup(ns.Delete)
		return ns
	}
	newBundle := func(name string, ns *netns.NS) string {
		b := filepath.Join(base, name)
		must(sandbox.NewBundle(b, kvBin, "-mib", "64"))
		must(sandbox.SetNetNS(b, ns.Path))
		return b
	}
	res := HTTPResult{Runtime: rt.name, Clones: clones}

	srcNS := newNS(0)
	defer srcNS.Delete()
	out := filepath.Join(base, "source.out")
	must(r.Run(newBundle("source", srcNS), "source", out))
	_, _, err := sandbox.WaitForLine(out, 0, 60*time.Second, func(l string) bool { return strings.HasPrefix(l, "ready ") })
	must(err)
	src := kvclient.New(srcNS.GuestIP)
	must(src.Set("origin", "source"))
	res.SourceRPS, res.SourceP50Us, res.SourceP99Us, err = src.Load("origin", time.Second)
	must(err)

	image := filepath.Join(base, "image")
	var flags []string
	if rt.fork {
		flags = []string{"--shared-base"}
	}
	must(r.Checkpoint("source", image, flags...))
	r.Destroy("source")

	for k := 0; k < clones; k++ {
		ns := newNS(k + 1)
		defer ns.Delete()
		id := fmt.Sprintf("clone%d", k)
		start := time.Now()
		must(r.Restore(newBundle(id, ns), id, image, filepath.Join(base, id+".out"), rt.restoreArgs...))
		c := kvclient.New(ns.GuestIP)
		if got, err := c.WaitGet("origin", 60*time.Second); err != nil || got != "source" {
			fatalf("http %s clone %d: origin=%q (%v), want the parked server's", rt.name, k, got, err)
		}
		res.FirstResponseMs = append(res.FirstResponseMs, ms(time.Since(start)))
		rps, p50, p99, err := c.Load("origin", time.Second)
		must(err)
		res.CloneRPS, res.CloneP50Us, res.CloneP99Us = append(res.CloneRPS, rps), append(res.CloneP50Us, p50), append(res.CloneP99Us, p99)
	}
	return res
}

func printHTTP(results []HTTPResult) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\nhttp: kvserver on --network=sandbox, %d clones per run each in its own network namespace; first_resp is restore start -> first GET answered; rps: sequential keep-alive GETs for 1 s\n", results[0].Clones)
	fmt.Printf("%-12s %10s %10s %10s %14s %10s %10s\n", "runtime", "src_rps", "src_p50us", "src_p99us", "first_resp_ms", "clone_rps", "clone_p50us")
	for _, r := range results {
		fmt.Printf("%-12s %10.0f %10.0f %10.0f %14.0f %10.0f %10.0f\n", r.Runtime, r.SourceRPS, r.SourceP50Us, r.SourceP99Us, r.FirstRespP50Ms, r.CloneRPSP50, median(r.CloneP50Us))
	}
}
