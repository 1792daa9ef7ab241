package main

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// VerifyResult is one way of reading a base block by block (verify
// scenario): per 2 MiB block, the time to fault it into a mapping, with or
// without hashing it, from a cold or a warm page cache.
type VerifyResult struct {
	BaseMiB     int       `json:"base_mib"`
	Mode        string    `json:"mode"`
	Cache       string    `json:"cache"` // "cold" (the file's page cache dropped) or "warm"
	PerBlockP50 float64   `json:"per_block_p50_us"`
	PerBlockP99 float64   `json:"per_block_p99_us"`
	MBps        float64   `json:"mb_per_s"` // over the whole pass
	SamplesUs   []float64 `json:"samples_us,omitempty"`
}

// VerifyRun is `runsc bases verify` of the same base: runsc's own (parallel)
// digest of a stored base, cold and warm.
type VerifyRun struct {
	BaseMiB int     `json:"base_mib"`
	Cache   string  `json:"cache"`
	Ms      float64 `json:"ms"`
	MBps    float64 `json:"mb_per_s"`
}

// dropFileCache writes f back and drops its pages from the page cache
// (fadvise DONTNEED: the file's pages only, not the whole host's), and
// returns how many of its pages are still resident.
func dropFileCache(f *os.File, size int64) int {
	dropCache(f)
	return residentPages(f, size)
}

// dropCache writes f back and drops its pages from the page cache (fadvise
// DONTNEED: the file's pages only, not the whole host's).
func dropCache(f *os.File) {
	must(f.Sync())
	must(unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
}

// residentPages returns the number of f's first size bytes' pages in the
// page cache (mincore over a mapping that faults nothing in).
func residentPages(f *os.File, size int64) int {
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	must(err)
	defer unix.Munmap(m)
	vec := make([]byte, (size+int64(os.Getpagesize())-1)/int64(os.Getpagesize()))
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		must(fmt.Errorf("mincore %s: %w", f.Name(), errno))
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// blockPass maps each 2 MiB block of f in turn, faults it in with
// MADV_POPULATE_READ (one call, as the fork's BaseFile.Populate does) and,
// if hash, computes its SHA-256, and returns the time of each block.
func blockPass(f *os.File, size int64, hash bool) []float64 {
	const block = blockmanifest.BlockSize
	var samples []float64
	for off := int64(0); off < size; off += block {
		m, err := unix.Mmap(int(f.Fd()), off, int(min(block, size-off)), unix.PROT_READ, unix.MAP_SHARED)
		must(err)
		start := time.Now()
		must(unix.Madvise(m, unix.MADV_POPULATE_READ))
		if hash {
			sha256.Sum256(m)
		}
		samples = append(samples, float64(time.Since(start).Nanoseconds())/1000)
		must(unix.Munmap(m))
	}
	return samples
}

// verifyCost measures what verifying a base before exposing it costs, per
// 2 MiB block and in bulk: a base of baseMiB MiB of random data (no zero
// block) is read block by block, faulted in only (the floor any restore
// pays to read it) or faulted in and hashed (what a verified lazy fetch
// would pay), from a cold and a warm page cache; then runsc verifies it as
// a stored base (`runsc bases verify`, its parallel digest), cold and warm.
// Only forkvisor verifies; upstream reads the same pages unverified, at the
// "populate" rows' cost.
func verifyCost(dir string, fork runtimeConfig, baseMiB int) ([]VerifyResult, []VerifyRun) {
	work := filepath.Join(dir, "verify")
	must(os.MkdirAll(work, 0o755))
	defer os.RemoveAll(work)
	path := filepath.Join(work, "base.img")
	size := int64(baseMiB) << 20
	f, err := os.Create(path)
	must(err)
	defer f.Close()
	rng := rand.NewChaCha8([32]byte{'f', 'o', 'r', 'k', 'v', 'i', 's', 'o', 'r'})
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		rng.Read(buf)
		_, err := f.Write(buf)
		must(err)
	}

	var results []VerifyResult
	for _, pass := range []struct {
		mode, cache string
		hash        bool
	}{
		{"populate", "cold", false},
		{"populate+sha256", "cold", true},
		{"populate", "warm", false},
		{"populate+sha256", "warm", true},
	} {
		if pass.cache == "cold" {
			if left := dropFileCache(f, size); left > 0 {
				fmt.Fprintf(os.Stderr, "forkbench: verify: %d pages of %s still cached after dropping\n", left, path)
			}
		} else {
			blockPass(f, size, false) // warm it
		}
		start := time.Now()
		samples := blockPass(f, size, pass.hash)
		total := time.Since(start)
		results = append(results, VerifyResult{
			BaseMiB:     baseMiB,
			Mode:        pass.mode,
			Cache:       pass.cache,
			PerBlockP50: median(samples),
			PerBlockP99: percentile(samples, 99),
			MBps:        float64(size) / 1e6 / total.Seconds(),
			SamplesUs:   samples,
		})
	}

	// The same bytes as a stored base, verified by runsc.
	m, err := blockmanifest.Build(f, uint64(size), nil)
	must(err)
	must(f.Chmod(0o444))
	r := &sandbox.Runsc{Bin: fork.bin, Root: filepath.Join(work, "root"), BaseStore: filepath.Join(work, "store")}
	_, err = r.Exec("bases", "import", m.Digest, path)
	must(err)
	stored, err := os.Open(r.StoredBase(m.Digest))
	must(err)
	defer stored.Close()
	var runs []VerifyRun
	for _, cache := range []string{"cold", "warm"} {
		if cache == "cold" {
			if left := dropFileCache(stored, size); left > 0 {
				fmt.Fprintf(os.Stderr, "forkbench: verify: %d pages of %s still cached after dropping\n", left, stored.Name())
			}
		}
		start := time.Now()
		_, err := r.Exec("bases", "verify", m.Digest)
		must(err)
		d := time.Since(start)
		runs = append(runs, VerifyRun{BaseMiB: baseMiB, Cache: cache, Ms: ms(d), MBps: float64(size) / 1e6 / d.Seconds()})
	}
	return results, runs
}

func printVerify(results []VerifyResult, runs []VerifyRun) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\nverify: a %d MiB base of random data, per 2 MiB block (cold: the file's page cache dropped with fadvise first)\n", results[0].BaseMiB)
	fmt.Printf("%-18s %-6s %12s %12s %10s\n", "mode", "cache", "p50_us/blk", "p99_us/blk", "MB/s")
	for _, r := range results {
		fmt.Printf("%-18s %-6s %12.0f %12.0f %10.0f\n", r.Mode, r.Cache, r.PerBlockP50, r.PerBlockP99, r.MBps)
	}
	for _, r := range runs {
		fmt.Printf("%-18s %-6s %12s %12s %10.0f   (%.0f ms for the whole base)\n", "runsc bases verify", r.Cache, "", "", r.MBps, r.Ms)
	}
}
