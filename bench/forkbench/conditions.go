package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
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
	Commit      string            `json:"commit"`       // git HEAD of this repository (+ "-dirty")
	SeriesHash  string            `json:"series_hash"`  // SHA-256 over patches/series and every patch it lists
	TreeHead    string            `json:"tree_head"`    // git HEAD of build/gvisor (+ "-dirty"), the tree bin/runsc was built from
	Binaries    map[string]string `json:"binaries"`     // SHA-256 of each binary the benchmark ran
	UpstreamPin string            `json:"upstream_pin"` // tools/PIN
	Kernel      string            `json:"kernel"`
	CPU         string            `json:"cpu"`
	CPUs        int               `json:"cpus"`
	GoVersion   string            `json:"go_version"`
	Args        []string          `json:"args"` // forkbench's command line
	PageCache   string            `json:"page_cache"`
}

func conditions() Conditions {
	c := Conditions{
		Commit:      gitHead("."),
		TreeHead:    gitHead("build/gvisor"),
		Binaries:    map[string]string{},
		SeriesHash:  seriesHash(),
		UpstreamPin: strings.TrimSpace(readFile("tools/PIN")),
		CPU:         cpuModel(),
		CPUs:        runtime.NumCPU(),
		GoVersion:   runtime.Version(),
		Args:        os.Args,
		// Every scenario reads its images right after writing them, for
		// every runtime alike; -cold drops them before each restore of the
		// clone scenarios.
		PageCache: pageCacheCondition(),
	}
	for _, b := range []string{*upstreamBin, *forkBin, *tickBin, *ociBin} {
		c.Binaries[b] = fileSHA256(b)
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		c.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return c
}

// gitHead returns the HEAD commit of the repository at dir, with "-dirty" if
// it has changes (untracked files included).
func gitHead(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	head := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", dir, "status", "--porcelain").Output(); err == nil && len(st) > 0 {
		head += "-dirty"
	}
	return head
}

func fileSHA256(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "missing"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "unreadable"
	}
	return hex.EncodeToString(h.Sum(nil))
}

func seriesHash() string {
	series := readFile("patches/series")
	if series == "" {
		return "unknown (no patches/series: run forkbench from the repository root)"
	}
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

// pageCacheCondition says what state the page cache is in when clones are
// restored.
func pageCacheCondition() string {
	if *cold {
		return "cold for clone scenarios (-cold: every image file written back and dropped with fadvise DONTNEED before each restore; pages that running clones map stay); other scenarios warm"
	}
	return "warm (images read back right after they are written; caches never dropped)"
}
