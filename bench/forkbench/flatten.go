package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// FlattenResult is one row of the flatten scenario: N MemoryFiles restored
// from one delta-only checkpoint over one base, in one process
// (pgalloc's TestSharedBaseFlatten), and what they cost.
type FlattenResult struct {
	N        int     `json:"n"`
	BaseMiB  float64 `json:"base_mib"`
	DeltaMiB float64 `json:"delta_mib"`
	// RssMiB, PssMiB and PrivateDirtyMiB are the clones' growth of the
	// process's smaps_rollup fields.
	RssMiB          float64 `json:"rss_mib"`
	PssMiB          float64 `json:"pss_mib"`
	PrivateDirtyMiB float64 `json:"private_dirty_mib"`
	// Ratio is Rss/Pss; Ideal is the ratio if the clones held the base's
	// unchanged pages once and their deltas privately, and nothing else.
	Ratio float64 `json:"ratio"`
	Ideal float64 `json:"ideal"`
	// Error is the test's failure, if it failed (the other fields are then
	// zero).
	Error string `json:"error,omitempty"`
}

// intList parses a comma-separated list of integers.
func intList(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		must(err)
		out = append(out, n)
	}
	return out
}

// flatten runs the flatten scenario for each N in ns: pgalloc's test binary
// is built from build/gvisor once, then run per N.
func flatten(dir string, ns []int) []FlattenResult {
	bin := abs(filepath.Join(dir, "pgalloc.test"))
	build := exec.Command("go", "test", "-c", "-o", bin, "./pkg/sentry/pgalloc/")
	build.Dir = "build/gvisor"
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fatalf("building pgalloc's tests: %v\n%s", err, out)
	}
	var out []FlattenResult
	for _, n := range ns {
		fmt.Fprintf(os.Stderr, "forkbench: flatten, N=%d\n", n)
		cmd := exec.Command(bin, "-test.run", "^TestSharedBaseFlatten$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("FLATTEN_N=%d", n))
		// A failure is recorded, not fatal: the scenarios run before this
		// one keep their results.
		b, err := cmd.CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "forkbench: flatten test for N=%d failed: %v\n%s\n", n, err, tail(b, 40))
			out = append(out, FlattenResult{N: n, Error: fmt.Sprintf("%v: %s", err, tail(b, 5))})
			continue
		}
		r, err := parseFlatten(string(b))
		if err != nil {
			fmt.Fprintf(os.Stderr, "forkbench: flatten for N=%d: %v\n", n, err)
			out = append(out, FlattenResult{N: n, Error: err.Error()})
			continue
		}
		out = append(out, r)
	}
	return out
}

// parseFlatten finds the test's FLATTEN line in its output.
func parseFlatten(out string) (FlattenResult, error) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "FLATTEN ") {
			continue
		}
		kv := map[string]float64{}
		for _, f := range strings.Fields(line)[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return FlattenResult{}, fmt.Errorf("malformed field %q in %q", f, line)
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return FlattenResult{}, fmt.Errorf("field %q in %q: %w", f, line, err)
			}
			kv[k] = x
		}
		for _, k := range []string{"n", "base_mib", "delta_mib", "rss_mib", "pss_mib", "private_dirty_mib", "ratio", "ideal"} {
			if _, ok := kv[k]; !ok {
				return FlattenResult{}, fmt.Errorf("no %s in %q", k, line)
			}
		}
		return FlattenResult{
			N: int(kv["n"]), BaseMiB: kv["base_mib"], DeltaMiB: kv["delta_mib"],
			RssMiB: kv["rss_mib"], PssMiB: kv["pss_mib"], PrivateDirtyMiB: kv["private_dirty_mib"],
			Ratio: kv["ratio"], Ideal: kv["ideal"],
		}, nil
	}
	return FlattenResult{}, fmt.Errorf("no FLATTEN line in the test's output:\n%s", tail([]byte(out), 20))
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func printFlatten(rs []FlattenResult) {
	if len(rs) == 0 {
		return
	}
	fmt.Printf("\nflatten: N MemoryFiles restored from one delta-only checkpoint over one base, in one process (growth of smaps_rollup)\n")
	fmt.Printf("%-4s %8s %9s %9s %9s %18s %7s %7s %9s\n", "N", "base_MiB", "delta_MiB", "rss_MiB", "pss_MiB", "private_dirty_MiB", "ratio", "ideal", "of_ideal")
	for _, r := range rs {
		if r.Error != "" {
			fmt.Printf("%-4d FAILED: %s\n", r.N, strings.ReplaceAll(r.Error, "\n", " | "))
			continue
		}
		fmt.Printf("%-4d %8.0f %9.0f %9.1f %9.1f %18.1f %7.2f %7.2f %8.0f%%\n", r.N, r.BaseMiB, r.DeltaMiB, r.RssMiB, r.PssMiB, r.PrivateDirtyMiB, r.Ratio, r.Ideal, 100*r.Ratio/r.Ideal)
	}
}
