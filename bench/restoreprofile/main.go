// Command restoreprofile summarizes a host-wide CPU profile of restores
// (perf record -g of bench/restoreone) by runsc build: for each build, the
// samples of its sandboxes, gofers and helpers (processes that run the
// build's binary under the name "exe", as runsc starts them through
// /proc/self/exe) whose stacks pass through each of a list of functions.
// A sample counts for a build when one of its frames is in the build's
// binary: the systrap stub processes' own code runs from an anonymous
// mapping and is not counted, nor is the runsc command itself (its name is
// "runsc").
// A sample counts once per function, whatever its depth. perf script's
// frames are "ADDRESS SYMBOL (BINARY)"; a function matches the end of a
// frame's symbol.
//
//	perf record -a -g -F 2999 -o /tmp/p.data -- go run ./bench/restoreone -n 20 /tmp/runsc-before bin/runsc
//	perf script -i /tmp/p.data --comm exe -F pid,ip,sym,dso | go run ./bench/restoreprofile /tmp/runsc-before bin/runsc
//
// bench/restore-profile.sh runs both. Samples are at the rate given to perf
// record (2999 Hz: one sample is 0.33 ms of CPU, with the profiler's own
// overhead).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// functions are the frames counted, in the order printed: what a restore
// spends that is the same for every image.
var functions = []struct{ label, frame string }{
	{"all samples", ""},
	{"package init (runtime.doInit1)", "runtime.doInit1"},
	{"platform creation (boot.createPlatform)", "boot.createPlatform"},
	{"seccomp programs built at run time (seccomp.(*Program).Build)", "seccomp.(*Program).Build"},
	{"precompiled seccomp table (filter.registerPrograms)", "filter.registerPrograms"},
	{"restore RPC (boot.(*containerManager).Restore)", "boot.(*containerManager).Restore"},
	{"  kernel load (kernel.(*Kernel).LoadFrom)", "kernel.(*Kernel).LoadFrom"},
	{"    its load statistics' table (state.(*Stats).String)", "state.(*Stats).String"},
	{"/proc umounter (sentrycmd.(*Umount).Execute)", "sentrycmd.(*Umount).Execute"},
	{"gofer (cmd.(*Gofer).Execute)", "cmd.(*Gofer).Execute"},
	{"host page faults (asm_exc_page_fault)", "asm_exc_page_fault"},
}

func main() {
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: perf script --comm exe -F pid,ip,sym,dso | restoreprofile BUILD...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	builds := flag.Args()
	if len(builds) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	paths := make([]string, len(builds))
	for i, b := range builds {
		// perf names the binary a process mapped: its resolved path.
		abs, err := filepath.Abs(b)
		if err == nil {
			abs, err = filepath.EvalSymlinks(abs)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "restoreprofile: %v\n", err)
			os.Exit(1)
		}
		paths[i] = abs
	}
	counts := make([][]int, len(builds))
	for i := range counts {
		counts[i] = make([]int, len(functions))
	}
	// Every sample of a process counts for its role, which one of its
	// samples' stacks shows (runsc starts all of them as "exe").
	roles := []struct{ label, frame string }{
		{"all samples of sandbox processes (sentrycmd.(*Boot).Execute)", "sentrycmd.(*Boot).Execute"},
		{"all samples of gofer processes (cmd.(*Gofer).Execute)", "cmd.(*Gofer).Execute"},
		{"all samples of /proc umounters (sentrycmd.(*Umount).Execute)", "sentrycmd.(*Umount).Execute"},
	}
	roleOf := map[string]int{}   // PID -> index in roles
	perPID := map[string][]int{} // PID -> samples per build
	var stack []string
	var pid string
	flush := func() {
		defer func() { stack = stack[:0] }()
		build := -1
		for _, frame := range stack {
			for i, p := range paths {
				if strings.HasSuffix(frame, "("+p+")") {
					build = i
				}
			}
		}
		if build < 0 {
			return
		}
		if perPID[pid] == nil {
			perPID[pid] = make([]int, len(builds))
		}
		perPID[pid][build]++
		for r, role := range roles {
			for _, frame := range stack {
				if strings.Contains(frame, role.frame+" (") {
					roleOf[pid] = r
				}
			}
		}
		for j, f := range functions {
			for _, frame := range stack {
				if f.frame == "" || strings.Contains(frame, f.frame+" (") {
					counts[build][j]++
					break
				}
			}
		}
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		if !strings.HasPrefix(line, "\t") {
			// A sample's header (its PID, right-aligned: it may
			// start with spaces) starts a new stack; frames start
			// with a tab.
			flush()
			pid = strings.TrimSpace(line)
			continue
		}
		stack = append(stack, strings.TrimSpace(line))
	}
	flush()
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "restoreprofile: reading perf script: %v\n", err)
		os.Exit(1)
	}
	for i, b := range builds {
		if counts[i][0] == 0 {
			fmt.Fprintf(os.Stderr, "restoreprofile: no sample of %s (%s): is it the binary the profiled runs used?\n", b, paths[i])
		}
	}
	fmt.Printf("%-78s", "samples whose stack passes through")
	for _, b := range builds {
		fmt.Printf(" %14s", filepath.Base(b))
	}
	fmt.Println()
	for j, f := range functions {
		fmt.Printf("%-78s", f.label)
		for i := range builds {
			fmt.Printf(" %14d", counts[i][j])
		}
		fmt.Println()
	}
	for r, role := range roles {
		procs := make([]int, len(builds))
		samples := make([]int, len(builds))
		for p, perBuild := range perPID {
			if rr, ok := roleOf[p]; !ok || rr != r {
				continue
			}
			for i, n := range perBuild {
				if n > 0 {
					procs[i]++
					samples[i] += n
				}
			}
		}
		fmt.Printf("%-78s", role.label)
		for i := range builds {
			fmt.Printf(" %14s", fmt.Sprintf("%d in %d", samples[i], procs[i]))
		}
		fmt.Println()
	}
}
