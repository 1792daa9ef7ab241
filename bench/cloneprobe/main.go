// Command cloneprobe prints the clone contract side by side: it parks the
// cloneprobe workload under upstream runsc and under forkvisor's runsc,
// restores 4 clones of each, parks clone 0 again and restores that, and
// prints for every value the probe reads whether the clones see it fresh,
// identical to the parked sandbox, or the same as each other.
//
// Usage (root; `make clone-probe` builds the binaries first):
//
//	go run ./bench/cloneprobe [-clones 4] [-signal USR2]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/forkvisor/forkvisor/internal/cloneprobe"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

func main() {
	clones := flag.Int("clones", 4, "clones per run")
	sig := flag.String("signal", "USR2", "restore signal the bundle asks for (annotation "+cloneprobe.SignalAnnotation+")")
	flag.Parse()

	dir, err := os.MkdirTemp("", "cloneprobe-")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(dir)
	runs := []struct {
		name   string
		bin    string
		flags  []string
		signal string
	}{
		// Upstream ignores the annotation: it is asked for the signal too.
		{"upstream", "bin/runsc-upstream", nil, *sig},
		{"forkvisor", "bin/runsc", []string{"--shared-base"}, ""},
		{"forkvisor+signal", "bin/runsc", []string{"--shared-base"}, *sig},
	}
	var results []*cloneprobe.Result
	for _, run := range runs {
		d := filepath.Join(dir, run.name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			fatal(err)
		}
		fmt.Fprintf(os.Stderr, "cloneprobe: %s: park, %d clones, re-park\n", run.name, *clones)
		res, err := cloneprobe.Run(cloneprobe.Options{
			Runsc:     &sandbox.Runsc{Bin: abs(run.bin), Root: filepath.Join(d, "root"), Upstream: run.name == "upstream"},
			ProbeBin:  abs("bin/cloneprobe"),
			Dir:       d,
			Clones:    *clones,
			ParkFlags: run.flags,
			Signal:    run.signal,
		})
		if err != nil {
			fatal(fmt.Errorf("%s: %w", run.name, err))
		}
		results = append(results, res)
	}

	fmt.Printf("\n%d clones of one parked sandbox; signal asked for: %s (except the middle column)\n\n", *clones, *sig)
	fmt.Printf("%-10s", "value")
	for _, run := range runs {
		fmt.Printf(" %-18s", run.name)
	}
	fmt.Println()
	for _, f := range cloneprobe.Fields {
		fmt.Printf("%-10s", f)
		for _, res := range results {
			fmt.Printf(" %-18s", cloneprobe.Classify(res, f))
		}
		fmt.Println()
	}
	fmt.Printf("\n%-10s", "gen")
	for _, res := range results {
		fmt.Printf(" %-18s", fmt.Sprintf("%s→%s→%s", res.Source.Gen, res.Clones[0].Gen, res.Reparked.Gen))
	}
	fmt.Printf("   (parked → clone → clone re-parked)\n%-10s", "signals")
	for _, res := range results {
		fmt.Printf(" %-18s", fmt.Sprintf("%d→%d→%d", res.Source.Signals, res.Settled[0].Signals, res.Reparked.Signals))
	}
	fmt.Println("   (signals the probe counted: parked → clone after 10 lines → re-parked clone)")
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		fatal(err)
	}
	return a
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "cloneprobe: %v\n", err)
	os.Exit(1)
}
