package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/pauselog"
	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/xfs"
)

// layerTickInterval is the layer workload's tick interval. A freeze is
// measured as the longest gap between ticks, so it is the pause plus up to
// one interval: 20 ms, as issue 9 measured it.
const layerTickInterval = 20 * time.Millisecond

// layers parks and restores a sandbox with a writable layer of each size,
// with both runtimes, on one loopback XFS.
//
// With dirty, each park follows the layer's writing at once (nothing
// flushed by the caller) and leaves the sandbox running: the result's
// FreezeMs is the longest gap between its layerTickInterval ticks around
// the park.
func layers(dir string, runtimes []runtimeConfig, dirty bool) []Result {
	if why := xfs.Available(); why != "" {
		fmt.Fprintf(os.Stderr, "forkbench: skipping layers: %s\n", why)
		return nil
	}
	sizes := intList(*layerSizes)
	total := 0
	for _, n := range sizes {
		total += n
	}
	fs, err := xfs.Mount(filepath.Join(dir, "xfs"), int64(4*total*(*layerRepeat)+4096)<<20)
	must(err)
	addCleanup(fs.Unmount)
	defer fs.Unmount()

	var results []Result
	for _, mib := range sizes {
		for _, rt := range runtimes {
			// Park and restore are tens of milliseconds for forkvisor:
			// report medians over repeats on this shared machine.
			var runs []Result
			for i := 0; i < *layerRepeat; i++ {
				runs = append(runs, layer(filepath.Join(fs.Dir, fmt.Sprint(i)), rt, mib, dirty))
			}
			res := runs[len(runs)-1]
			var park, restore, freeze, pause []float64
			for _, r := range runs {
				park = append(park, r.CheckpointMs)
				restore = append(restore, r.RestoreP50Ms)
				freeze = append(freeze, r.FreezeMs)
				pause = append(pause, r.PauseMs)
			}
			res.CheckpointMs = median(park)
			res.FreezeMs = median(freeze)
			res.FreezeSamplesMs = freeze
			if dirty {
				res.PauseMs = median(pause)
				res.PauseSamplesMs = pause
			}
			res.RestoreMs = restore
			res.RestoreP50Ms, res.RestoreMaxMs = median(restore), maxOf(restore)
			res.Repeats = len(runs)
			results = append(results, res)
		}
	}
	return results
}

func layer(dir string, rt runtimeConfig, layerMiB int, dirty bool) Result {
	base := filepath.Join(dir, fmt.Sprintf("layer%d-%s", layerMiB, rt.name))
	r := &sandbox.Runsc{Bin: rt.bin, Root: filepath.Join(base, "root"), Upstream: !rt.fork, LogDir: runtimeLogDir(fmt.Sprintf("layer%d", layerMiB), rt)}
	if dirty {
		// The pause is read from the sandbox's log (info level, for both
		// runtimes alike), in a directory of this run's own: -log-dir's
		// is shared by every repetition.
		if r.LogDir == "" {
			r.LogDir = filepath.Join(base, "logs")
		} else {
			r.LogDir = filepath.Join(r.LogDir, "dirty-"+filepath.Base(dir))
			must(os.RemoveAll(r.LogDir)) // an earlier invocation's
		}
		r.LogInfo = true
		must(os.MkdirAll(r.LogDir, 0o755))
	}
	addCleanup(r.Cleanup)
	defer r.Cleanup()
	bundle := filepath.Join(base, "bundle")
	// A small memory state (1 MiB heap, 1 MiB read buffer, garbage collected)
	// so that the image shows what the layer costs.
	must(sandbox.NewBundleEnv(bundle, abs(*tickBin), []string{"PATH=/"}, "-mib", "1", "-check-mib", "1", "-interval", layerTickInterval.String(), "-file", "/layer.bin", "-file-mib", fmt.Sprint(layerMiB)))
	out := filepath.Join(base, "source.out")
	_, err := r.RunUntilTick(bundle, "source", out, 2, func(t sandbox.Tick) bool { return t.File == "ok" })
	must(err)

	res := Result{Scenario: "layers", Runtime: rt.name, HeapMiB: 1, Clones: 1, LayerMiB: layerMiB}
	if !dirty {
		// Park a layer that is on disk, as a layer written more than a
		// few seconds before parking is (dirty pages are written back
		// after 30 s by default): flush the filesystem first, for both
		// runtimes.
		syncFS(dir)
	} else {
		res.Scenario = "layers-dirty"
	}
	image := filepath.Join(base, "image")
	snap := filepath.Join(base, "snap")
	var ckptFlags, restoreFlags []string
	if rt.fork {
		ckptFlags = []string{"--skip-filestore-pages", "--filestore-snapshot-dir=" + snap}
		restoreFlags = []string{"--filestore-adopt-dir=" + snap}
	}
	if dirty {
		ckptFlags = append(ckptFlags, "--leave-running")
	}
	gaps := watchTicks(out)
	start := time.Now()
	must(r.Checkpoint("source", image, ckptFlags...))
	res.CheckpointMs = ms(time.Since(start))
	if dirty {
		time.Sleep(300 * time.Millisecond)
		res.FreezeMs = ms(gaps(start.Add(-100 * time.Millisecond)))
		pause, err := pauselog.Dir(r.LogDir)
		must(err)
		res.PauseMs = ms(pause)
	}
	r.Destroy("source")
	res.ImageBytes, _ = diskUsage(image)
	res.ImageBytesNoBase = res.ImageBytes
	if rt.fork {
		res.SnapshotBytes, _ = diskUsage(snap)
	}

	cloneOut := filepath.Join(base, "clone.out")
	ft, took, err := r.RestoreFirstTick(bundle, "clone", image, cloneOut, restoreFlags...)
	must(err)
	res.RestoreMs = []float64{ms(took)}
	res.RestoreP50Ms, res.RestoreMaxMs = res.RestoreMs[0], res.RestoreMs[0]
	// The restored layer must be intact: wait for a full pass over it.
	tk, _, err := sandbox.WaitTick(cloneOut, 0, 600*time.Second, func(tk sandbox.Tick) bool {
		return tk.N >= ft.N+layerMiB+2 || tk.File == "BAD"
	})
	must(err)
	if tk.File != "ok" {
		fatalf("%s layer %d MiB: restored layer corrupt at tick %d (file %s)", rt.name, layerMiB, tk.N, tk.File)
	}
	r.Destroy("clone")
	return res
}

// watchTicks records when each line of the tick output out arrives, and
// returns a function that stops and returns the longest gap between
// arrivals after from. The watch's start counts as an arrival: a runtime
// that pauses the sandbox as soon as its checkpoint starts prints no line
// between the watch's start and the pause, and the gap from the start to
// the first line after the pause (a lower bound of the time since the last
// line before it) is then its freeze.
func watchTicks(out string) func(from time.Time) time.Duration {
	stop := make(chan struct{})
	done := make(chan []time.Time)
	arrivals := []time.Time{time.Now()}
	go func() {
		// A growing file is a new line: stat, not re-read, every
		// millisecond.
		size := func() int64 {
			st, err := os.Stat(out)
			if err != nil {
				return 0
			}
			return st.Size()
		}
		n := size()
		for {
			select {
			case <-stop:
				done <- arrivals
				return
			default:
			}
			if m := size(); m > n {
				arrivals = append(arrivals, time.Now())
				n = m
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return func(from time.Time) time.Duration {
		close(stop)
		arrivals := <-done
		var longest time.Duration
		for i := 1; i < len(arrivals); i++ {
			if arrivals[i].After(from) {
				longest = max(longest, arrivals[i].Sub(arrivals[i-1]))
			}
		}
		return longest
	}
}

// syncFS flushes the filesystem that holds dir.
func syncFS(dir string) {
	f, err := os.Open(dir)
	must(err)
	defer f.Close()
	must(unix.Syncfs(int(f.Fd())))
}
