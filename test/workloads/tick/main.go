// Command tick is the built-in workload: it fills a heap of a given size with
// a deterministic pattern, then every interval prints a tick counter and
// whether the heap still holds the pattern. A restored clone must continue
// the counter (not restart it) and keep printing "sum=ok".
//
// Usage: tick [-mib N] [-interval D]
//
// Output, one line per tick:
//
//	tick=N mib=M sum=ok|BAD
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// pattern returns the expected value of word i of the heap.
func pattern(i int) uint64 {
	x := uint64(i)*0x9E3779B97F4A7C15 + 1
	x ^= x >> 29
	return x
}

func main() {
	mib := flag.Int("mib", 64, "heap size in MiB")
	interval := flag.Duration("interval", 100*time.Millisecond, "tick interval")
	flag.Parse()

	words := *mib << 20 / 8
	heap := make([]uint64, words)
	for i := range heap {
		heap[i] = pattern(i)
	}
	// Verify a slice of the heap per tick so that every page is checked
	// within a few seconds without slowing the tick.
	const wordsPerTick = 4 << 20 / 8
	next := 0
	bad := false
	for tick := 0; ; tick++ {
		for n := 0; n < wordsPerTick && n < words; n++ {
			if heap[next] != pattern(next) {
				bad = true
			}
			next = (next + 1) % words
		}
		sum := "ok"
		if bad {
			sum = "BAD"
		}
		fmt.Printf("tick=%d mib=%d sum=%s\n", tick, *mib, sum)
		os.Stdout.Sync()
		time.Sleep(*interval)
	}
}
