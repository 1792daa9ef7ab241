package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Conditions records what a result file was measured with, so that a
// number can be traced to the code and machine that printed it.
type Conditions struct {
	Commit      string   `json:"commit"`       // git HEAD of this repository (+ "-dirty")
	SeriesHash  string   `json:"series_hash"`  // SHA-256 over patches/series and every patch it lists
	UpstreamPin string   `json:"upstream_pin"` // tools/PIN
	Kernel      string   `json:"kernel"`
	CPU         string   `json:"cpu"`
	CPUs        int      `json:"cpus"`
	GoVersion   string   `json:"go_version"`
	Args        []string `json:"args"` // forkbench's command line
	PageCache   string   `json:"page_cache"`
}

func conditions() Conditions {
	c := Conditions{
		Commit:      gitHead(),
		SeriesHash:  seriesHash(),
		UpstreamPin: strings.TrimSpace(readFile("tools/PIN")),
		CPU:         cpuModel(),
		CPUs:        runtime.NumCPU(),
		GoVersion:   runtime.Version(),
		Args:        os.Args,
		// Every scenario reads its images right after writing them, for
		// every runtime alike; nothing drops caches.
		PageCache: "warm (images read back right after they are written; caches never dropped)",
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		c.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return c
}

func gitHead() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	head := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		head += "-dirty"
	}
	return head
}

func seriesHash() string {
	series := readFile("patches/series")
	h := sha256.New()
	h.Write([]byte(series))
	var names []string
	for _, l := range strings.Split(series, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			names = append(names, l)
		}
	}
	for _, n := range names {
		h.Write([]byte(readFile(filepath.Join("patches", n))))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	models := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			models[strings.TrimSpace(v)] = true
		}
	}
	var out []string
	for m := range models {
		out = append(out, m)
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
