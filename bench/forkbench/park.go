package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// parkedTick is a tick workload parked by one runtime, for a scenario to
// restore clones of.
type parkedTick struct {
	r             *sandbox.Runsc
	bundle, image string
}

// parkTick runs the tick workload (tickArgs) with rt under base, parks it
// (forkvisor: --shared-base) into base/image and removes the source. The
// caller removes base and runs r.Cleanup (both are also registered to run
// if the benchmark dies).
func parkTick(base, scenario string, rt runtimeConfig, tickArgs ...string) *parkedTick {
	r := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root"), Upstream: !rt.fork, LogDir: runtimeLogDir(scenario, rt)}
	addCleanup(r.Cleanup)
	addCleanup(func() { os.RemoveAll(base) })
	p := &parkedTick{r: r, bundle: filepath.Join(base, "bundle"), image: filepath.Join(base, "image")}
	must(sandbox.NewBundle(p.bundle, abs(*tickBin), tickArgs...))
	_, err := r.RunUntilTick(p.bundle, "source", filepath.Join(base, "source.out"), 2, nil)
	must(err)
	var flags []string
	if rt.fork {
		flags = append(flags, "--shared-base")
	}
	must(r.Checkpoint("source", p.image, flags...))
	r.Destroy("source")
	return p
}

// waitFullPass waits until the tick workload writing out has checked its
// whole heap of mib MiB (checkMiB per tick) from now on; a bad checksum on
// the way fails the benchmark.
func waitFullPass(out string, mib, checkMiB int) {
	from := len(sandbox.Lines(out))
	first, _, err := sandbox.WaitTick(out, from, 120*time.Second, func(sandbox.Tick) bool { return true })
	must(err)
	_, _, err = sandbox.WaitTick(out, from, 300*time.Second, func(t sandbox.Tick) bool { return t.N >= first.N+mib/checkMiB+2 })
	must(err)
}

// kindsMiB converts memstat's KiB by kind into MiB, divided by n.
func kindsMiB(byKind map[string]uint64, n int) map[string]float64 {
	out := map[string]float64{}
	for k, v := range byKind {
		out[k] = float64(v) / 1024 / float64(n)
	}
	return out
}

// kindColumns formats the kinds of memory in k as table columns, in
// memstat's order.
func kindColumns(k map[string]float64) string {
	return fmt.Sprintf("%10.1f %10.1f %10.1f %10.1f %10.1f", k[memstat.KindGuest], k[memstat.KindBase], k[memstat.KindPlatform], k[memstat.KindAnon], k[memstat.KindFile])
}

// eachRuntime runs scenario with each of runtimes in turn, each in
// dir/scenario-<runtime>, and returns the results in that order.
func eachRuntime[T any](dir, scenario string, runtimes []runtimeConfig, run func(base string, rt runtimeConfig) T) []T {
	var results []T
	for _, rt := range runtimes {
		fmt.Fprintf(os.Stderr, "forkbench: %s, %s\n", scenario, rt.name)
		results = append(results, run(filepath.Join(dir, scenario+"-"+rt.name), rt))
	}
	return results
}

// dropImageCache writes back and drops the page cache of every regular file
// in the image directory image, for a restore that reads it cold. A base
// that is a link of the node store's file is the same inode, so it is
// dropped too; pages that running sandboxes map stay cached.
func dropImageCache(image string) {
	entries, err := os.ReadDir(image)
	must(err)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(image, e.Name()))
		must(err)
		dropCache(f)
		f.Close()
	}
}
