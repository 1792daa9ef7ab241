// Package cloneprobe parks the cloneprobe workload (test/workloads/cloneprobe)
// in a real runsc sandbox, restores clones of it, and classifies what the
// clones see: which values are fresh in every clone, which are identical,
// and which a restore signal lets the workload reseed. It backs the clone
// contract's test and `make clone-probe`.
package cloneprobe

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// Sample is one line of the probe.
type Sample struct {
	N       int
	Gen     string // "none" where the runtime has no restore generation
	Signals int
	// Fields holds every key=value of the line, including the above.
	Fields map[string]string
}

// Parse parses a probe line.
func Parse(line string) (Sample, error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "probe" {
		return Sample{}, fmt.Errorf("not a probe line: %q", line)
	}
	s := Sample{Fields: map[string]string{}}
	for _, kv := range f[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return Sample{}, fmt.Errorf("probe line %q: field %q is not key=value", line, kv)
		}
		s.Fields[k] = v
	}
	var err error
	if s.N, err = strconv.Atoi(s.Fields["n"]); err != nil {
		return Sample{}, fmt.Errorf("probe line %q: n: %w", line, err)
	}
	if s.Signals, err = strconv.Atoi(s.Fields["signals"]); err != nil {
		return Sample{}, fmt.Errorf("probe line %q: signals: %w", line, err)
	}
	s.Gen = s.Fields["gen"]
	return s, nil
}

// Options say how to run one side of the probe.
type Options struct {
	// Runsc is the runtime under test, with its own root.
	Runsc *sandbox.Runsc
	// ProbeBin is the static cloneprobe binary.
	ProbeBin string
	// Dir receives the bundle, the images and the outputs.
	Dir string
	// Clones is the number of clones restored from the first park.
	Clones int
	// ParkFlags are passed to every checkpoint (e.g. --shared-base).
	ParkFlags []string
	// Signal, if set, is the restore signal the bundle asks for (annotation
	// dev.gvisor.restore-signal); the probe reseeds its PRNG on it.
	Signal string
	// PausedFor, if not zero, restores every clone with `runsc restore
	// --paused` and resumes it after PausedFor, so that the contract is
	// checked for clones that waited restored (warmpool.NewRestored).
	PausedFor time.Duration
}

// Result is what one side of the probe saw.
type Result struct {
	// Source is the last line the parked sandbox printed.
	Source Sample
	// Clones are the first line of each clone begun after its restore (the
	// second it prints; with Signal: the first line that counts the
	// signal).
	Clones []Sample
	// Settled are a line of each clone at least 10 lines after Clones.
	Settled []Sample
	// Reparked is the first line begun after a restore of clone 0 parked
	// again (with Signal: the first line that counts the second signal).
	Reparked Sample
}

// SignalAnnotation is the OCI annotation that asks for a restore signal.
const SignalAnnotation = "dev.gvisor.restore-signal"

const (
	lineTimeout = 30 * time.Second
	// signalTimeout bounds the wait for the signal after the first line.
	signalTimeout = 3 * time.Second
)

// Run starts the probe as container "source", parks it, restores
// o.Clones clones one after another, then parks clone 0 again and restores
// that. Every container is destroyed before it returns.
func Run(o Options) (*Result, error) {
	r := o.Runsc
	defer r.Cleanup()
	bundle := filepath.Join(o.Dir, "bundle")
	args := []string{"-interval", "50ms", "-reseed-signal", "USR2"}
	if o.Signal != "" {
		args[len(args)-1] = o.Signal
	}
	if err := sandbox.NewBundle(bundle, o.ProbeBin, args...); err != nil {
		return nil, err
	}
	if o.Signal != "" {
		if err := sandbox.Annotate(bundle, map[string]string{SignalAnnotation: o.Signal}); err != nil {
			return nil, err
		}
	}
	srcOut := filepath.Join(o.Dir, "source.out")
	if err := r.Run(bundle, "source", srcOut); err != nil {
		return nil, err
	}
	if _, err := WaitSample(srcOut, lineTimeout, func(s Sample) bool { return s.N >= 3 }); err != nil {
		return nil, err
	}
	image := filepath.Join(o.Dir, "image")
	if err := r.Checkpoint("source", image, o.ParkFlags...); err != nil {
		return nil, err
	}
	r.Destroy("source")
	lines := sandbox.Lines(srcOut)
	src, err := Parse(lines[len(lines)-1])
	if err != nil {
		return nil, err
	}
	res := &Result{Source: src}

	restore := func(id, image string, wantSignals int, flags ...string) (Sample, string, error) {
		out := filepath.Join(o.Dir, id+".out")
		if o.PausedFor > 0 {
			flags = append([]string{"--paused"}, flags...)
		}
		if err := r.Restore(bundle, id, image, out, flags...); err != nil {
			return Sample{}, "", err
		}
		if o.PausedFor > 0 {
			time.Sleep(o.PausedFor)
			if err := r.Resume(id); err != nil {
				return Sample{}, "", err
			}
		}
		// The first line a clone prints may have been formatted before
		// the park: the probe can be paused between reading its values
		// and writing them, and writes them after the restore. The next
		// line was begun after that write, so after the restore.
		first, err := WaitSample(out, lineTimeout, func(Sample) bool { return true })
		if err != nil {
			return first, out, err
		}
		s, err := WaitSample(out, lineTimeout, func(s Sample) bool { return s.N > first.N })
		if err != nil || o.Signal == "" {
			return s, out, err
		}
		// A runtime that does not deliver the signal (upstream) keeps the
		// first line.
		if sig, err := WaitSample(out, signalTimeout, func(s Sample) bool { return s.Signals >= wantSignals }); err == nil {
			s = sig
		}
		return s, out, nil
	}
	var outs []string
	for i := 0; i < o.Clones; i++ {
		s, out, err := restore(fmt.Sprintf("clone%d", i), image, src.Signals+1)
		if err != nil {
			return nil, err
		}
		res.Clones = append(res.Clones, s)
		outs = append(outs, out)
	}
	for i, out := range outs {
		first := res.Clones[i].N
		s, err := WaitSample(out, lineTimeout, func(s Sample) bool { return s.N >= first+10 })
		if err != nil {
			return nil, err
		}
		res.Settled = append(res.Settled, s)
	}
	if o.Clones > 0 {
		image2 := filepath.Join(o.Dir, "image-repark")
		if err := r.Checkpoint("clone0", image2, o.ParkFlags...); err != nil {
			return nil, fmt.Errorf("parking clone0 again: %w", err)
		}
		for i := range outs {
			r.Destroy(fmt.Sprintf("clone%d", i))
		}
		// A clone parked with --shared-base references the base of the
		// first park instead of writing its own.
		var flags []string
		if base := filepath.Join(image, "base.img"); exists(base) && !exists(filepath.Join(image2, "base.img")) {
			flags = append(flags, "--shared-base="+base)
		}
		if res.Reparked, _, err = restore("reclone", image2, res.Settled[0].Signals+1, flags...); err != nil {
			return nil, err
		}
		r.Destroy("reclone")
	}
	return res, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// WaitSample waits up to timeout for the first probe line in path that
// satisfies match.
func WaitSample(path string, timeout time.Duration, match func(Sample) bool) (Sample, error) {
	line, _, err := sandbox.WaitForLine(path, 0, timeout, func(l string) bool {
		s, err := Parse(l)
		return err == nil && match(s)
	})
	if err != nil {
		return Sample{}, err
	}
	return Parse(line)
}

// Fields are the probe's fields in the order of the table.
var Fields = []string{"boot_id", "uuid", "getrandom", "urandom", "prng", "gen", "signals", "mono_ns", "wall_ns", "addr", "pid"}

// Classify says how a field of the clones relates to each other and to the
// source: "fresh" (every clone differs from the others and from the
// source), "identical" (every clone equals the source), "same in clones"
// (clones equal each other but not the source), or "mixed".
func Classify(res *Result, field string) string {
	seen := map[string]bool{}
	src := res.Source.Fields[field]
	allSrc := true
	for _, c := range res.Clones {
		v := c.Fields[field]
		seen[v] = true
		if v != src {
			allSrc = false
		}
	}
	switch {
	case allSrc:
		return "identical"
	case len(seen) == len(res.Clones) && !seen[src]:
		return "fresh"
	case len(seen) == 1:
		return "same in clones"
	}
	return "mixed"
}
