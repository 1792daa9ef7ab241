package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// StorageResult is one runtime's numbers for the storage scenario: the bytes
// on disk of a parked agent over park/resume cycles of a workload that
// changes a little each cycle.
type StorageResult struct {
	Runtime string `json:"runtime"`
	HeapMiB int    `json:"heap_mib"`
	Cycles  int    `json:"cycles"`

	// ImageMiB is, per park (the first park, then one per cycle), what
	// the image directory allocates on disk without a shared base.
	ImageMiB []float64 `json:"image_mib"`
	// BaseMiB is what the node base store allocates (every base once).
	BaseMiB float64 `json:"base_mib"`
	// TotalMiB is what keeping every park of the lineage costs: the images
	// plus the store.
	TotalMiB float64 `json:"total_mib"`
}

// storage parks a 256 MiB tick workload that stores into 1% of its pages
// every tick, then 10 times restores the last park, lets it tick 3 times
// and parks it again, keeping every image.
func storage(dir string, runtimes []runtimeConfig) []StorageResult {
	const heapMiB, cycles = 256, 10
	return eachRuntime(dir, "storage", runtimes, func(base string, rt runtimeConfig) StorageResult {
		return storageRun(base, rt, heapMiB, cycles)
	})
}

func storageRun(base string, rt runtimeConfig, heapMiB, cycles int) StorageResult {
	r := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root"), Upstream: !rt.fork, LogDir: runtimeLogDir("storage", rt)}
	addCleanup(r.Cleanup)
	// Deferred in this order so that the sandboxes go before their root.
	defer os.RemoveAll(base)
	defer r.Cleanup()
	defer os.RemoveAll(r.StorePath())
	bundle := filepath.Join(base, "bundle")
	must(sandbox.NewBundle(bundle, abs(*tickBin), "-mib", fmt.Sprint(heapMiB), "-interval", "50ms", "-check-mib", "4", "-write-pct", "1"))
	out := filepath.Join(base, "c0.out")
	_, err := r.RunUntilTick(bundle, "c0", out, 2, nil)
	must(err)
	var flags []string
	if rt.fork {
		flags = []string{"--shared-base"}
	}
	res := StorageResult{Runtime: rt.name, HeapMiB: heapMiB, Cycles: cycles}
	park := func(id string, n int) string {
		image := filepath.Join(base, fmt.Sprintf("image%d", n))
		must(r.Checkpoint(id, image, flags...))
		r.Destroy(id)
		_, noBase := diskUsage(image)
		res.ImageMiB = append(res.ImageMiB, mib(noBase))
		return image
	}
	image := park("c0", 0)
	// The first restore of a base learns its write set (forkvisor), and the
	// pages it copies while learning are private at other offsets than
	// their base pages, so a lineage through the learner carries them in
	// every later park. A fleet learns once per base: learn on a clone that
	// is not part of the lineage, as clones256 does.
	learnWriteSet(r, rt, bundle, image, filepath.Join(base, "learner.out"))
	for c := 1; c <= cycles; c++ {
		id := fmt.Sprintf("c%d", c)
		out := filepath.Join(base, id+".out")
		first, _, err := r.RestoreFirstTick(bundle, id, image, out, rt.restoreArgs...)
		must(err)
		_, _, err = sandbox.WaitTick(out, 0, 60*time.Second, func(t sandbox.Tick) bool { return t.N >= first.N+3 })
		must(err)
		image = park(id, c)
	}
	if rt.fork {
		res.BaseMiB = mib(allocatedOnce(r.StorePath()))
	}
	res.TotalMiB = res.BaseMiB
	for _, m := range res.ImageMiB {
		res.TotalMiB += m
	}
	return res
}

// allocatedOnce returns the bytes allocated by the files under dir, each
// inode counted once.
func allocatedOnce(dir string) int64 {
	seen := map[uint64]bool{}
	var total int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && !seen[st.Ino] {
			seen[st.Ino] = true
			total += st.Blocks * 512
		}
		return nil
	})
	return total
}

func printStorage(results []StorageResult) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\nstorage: a %d MiB workload storing into 1%% of its pages per tick, parked, then %d times restored, ticked 3 times and parked again; MiB allocated on disk\n", results[0].HeapMiB, results[0].Cycles)
	fmt.Printf("%-12s %10s %12s %12s %10s %10s\n", "runtime", "first_MiB", "per_cycle", "max_cycle", "base_MiB", "total_MiB")
	for _, r := range results {
		later := r.ImageMiB[1:]
		fmt.Printf("%-12s %10.1f %12.1f %12.1f %10.1f %10.1f\n", r.Runtime, r.ImageMiB[0], median(later), maxOf(later), r.BaseMiB, r.TotalMiB)
	}
}
