// Command restorephases prints where the time of `runsc restore` goes, phase
// by phase (restorelog.Phases), and costs within the phases that every image
// pays (restorelog.Steps), from runsc's debug logs: for each directory
// given (one per runtime, as `forkbench -log-dir DIR` writes them:
// DIR/<scenario>-<runtime>), the first restore and the median of the others,
// and the kernel load's most expensive object types. Each phase's median is
// taken on its own, so the medians need not add up to the median total.
//
//	go run ./bench/forkbench -scenarios clones256 -log-dir /tmp/rl
//	go run ./bench/restorephases /tmp/rl/clones256-*
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/forkvisor/forkvisor/internal/restorelog"
)

var topTypes = flag.Int("types", 5, "object types of the kernel load to print per directory")

func main() {
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: restorephases [-types N] LOGDIR...")
		os.Exit(2)
	}
	type column struct {
		name string
		rs   []*restorelog.Restore
	}
	var cols []column
	for _, dir := range flag.Args() {
		rs, err := restorelog.Dir(dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "restorephases: %v\n", err)
			os.Exit(1)
		}
		if len(rs) == 0 {
			fmt.Fprintf(os.Stderr, "restorephases: %s: no restore logged (was it written by runsc --debug --debug-log=DIR/?)\n", dir)
			os.Exit(1)
		}
		cols = append(cols, column{filepath.Base(dir), rs})
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "phase (ms)\t")
	for _, c := range cols {
		fmt.Fprintf(tw, "%s first\t%s p50 (n=%d)\t", c.name, c.name, len(c.rs)-1)
	}
	fmt.Fprintln(tw)
	row := func(name string, get func(*restorelog.Restore) (time.Duration, bool)) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, c := range cols {
			fmt.Fprintf(tw, "%s\t%s\t", ms(get(c.rs[0])), ms(median(c.rs[1:], get)))
		}
		fmt.Fprintln(tw)
	}
	for _, p := range restorelog.Phases {
		row(p.Name, func(r *restorelog.Restore) (time.Duration, bool) { return r.Phase(p) })
	}
	row("total: runsc restore → tasks started", (*restorelog.Restore).Total)
	fmt.Fprint(tw, "within the phases (not additive):\t")
	for range cols {
		fmt.Fprint(tw, "\t\t")
	}
	fmt.Fprintln(tw)
	for _, p := range restorelog.Steps {
		row(p.Name, func(r *restorelog.Restore) (time.Duration, bool) { return r.Phase(p) })
	}
	tw.Flush()

	for _, c := range cols {
		fmt.Printf("\n%s: kernel load by object type (the median restore after the first; ms, count)\n", c.name)
		r := medianRestore(c.rs)
		for i, s := range r.LoadStats {
			if i == *topTypes {
				break
			}
			fmt.Printf("  %8.1f  %7d  %s\n", float64(s.Total)/float64(time.Millisecond), s.Count, s.Type)
		}
	}
}

// median returns the median of get over rs, or false if none has it.
func median(rs []*restorelog.Restore, get func(*restorelog.Restore) (time.Duration, bool)) (time.Duration, bool) {
	var ds []time.Duration
	for _, r := range rs {
		if d, ok := get(r); ok {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return 0, false
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], true
}

// medianRestore returns the restore after the first whose total is the
// median (the first if there is no other).
func medianRestore(rs []*restorelog.Restore) *restorelog.Restore {
	if len(rs) == 1 {
		return rs[0]
	}
	rest := append([]*restorelog.Restore(nil), rs[1:]...)
	sort.Slice(rest, func(i, j int) bool {
		a, _ := rest[i].Total()
		b, _ := rest[j].Total()
		return a < b
	})
	return rest[len(rest)/2]
}

func ms(d time.Duration, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}
