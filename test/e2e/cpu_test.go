//go:build amd64

package e2e

import (
	"bytes"
	"context"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/cpuid"
	"gvisor.dev/gvisor/pkg/state"
	"gvisor.dev/gvisor/pkg/state/statefile"
)

// TestCPUFeatureGate checks restore's CPU-feature policy on a real image
// whose guest was shown a feature this host lacks, as if it had been parked
// on another node: the default refuses it before anything starts, naming
// the file, the feature and the flag, and leaves the image as it was;
// --cpu-features-may-lack with that feature restores it correctly.
func TestCPUFeatureGate(t *testing.T) {
	src := startSource(t, "runsc", 32)
	p := src.park(t, filepath.Join(src.dir, "image"))
	absent := absentFeature(t)
	allowing := *p.r
	allowing.Flags = []string{"--cpu-features-may-lack=" + absent.String()}

	foreign := copyImage(t, p.image, "foreign")
	rewriteCPUFeatures(t, foreign, func(s cpuid.Static) { s.Add(absent) })

	t.Run("refused by default", func(t *testing.T) {
		before := dirSums(t, foreign)
		err := p.r.Restore(p.bundle, "refused", foreign, filepath.Join(p.dir, "refused.out"))
		if err == nil {
			t.Fatal("restore of an image that needs a CPU feature this host lacks succeeded")
		}
		for _, want := range []string{
			filepath.Join(foreign, "checkpoint.img"),
			"CPU features that this host lacks: " + absent.String() + ".",
			"--cpu-features-may-lack=" + absent.String(),
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("restore error %q does not contain %q", err, want)
			}
		}
		t.Logf("refused: %s", lastLine(err.Error()))
		if out, err := p.r.Exec("state", "refused"); err == nil {
			t.Errorf("a refused restore left a container: %s", out)
		}
		if after := dirSums(t, foreign); !maps.Equal(before, after) {
			t.Errorf("a refused restore changed the image: %v, then %v", before, after)
		}
	})

	t.Run("allowed to lack it", func(t *testing.T) {
		p.r = &allowing
		p.restoreClone(t, "allowed", foreign, p.lastTick)
	})

}

// absentFeature returns a CPU feature that this host lacks.
func absentFeature(t *testing.T) cpuid.Feature {
	t.Helper()
	cpuid.Initialize()
	host := cpuid.HostFeatureSet()
	for _, f := range cpuid.AllFeatures() {
		if name := f.String(); !host.HasFeature(f) && !strings.ContainsAny(name, " ,[") {
			return f
		}
	}
	t.Fatal("this host has every CPU feature that gVisor knows; the gate cannot be tested here")
	return 0
}

// rewriteCPUFeatures rewrites the feature set that the checkpoint in image
// recorded for its guest (the first object of its state file, which the
// restore checks before it loads the kernel) with edit applied, keeping the
// rest of the state byte for byte.
func rewriteCPUFeatures(t *testing.T, image string, edit func(cpuid.Static)) {
	t.Helper()
	path := filepath.Join(image, "checkpoint.img")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	r, metadata, err := statefile.NewReader(f, nil)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	rest := bytes.NewReader(data)
	var fs cpuid.FeatureSet
	if _, err := state.Load(context.Background(), rest, &fs); err != nil {
		t.Fatalf("%s: loading the feature set: %v", path, err)
	}
	static, ok := fs.Function.(cpuid.Static)
	if !ok {
		t.Fatalf("%s: the feature set is a %T, want a cpuid.Static", path, fs.Function)
	}
	edit(static)

	for k := range metadata {
		if strings.HasPrefix(k, "_") { // statefile's own keys
			delete(metadata, k)
		}
	}
	var out bytes.Buffer
	w, err := statefile.NewWriter(&out, nil, metadata)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := state.Save(context.Background(), w, &fs); err != nil {
		t.Fatalf("saving the feature set: %v", err)
	}
	if _, err := io.Copy(w, rest); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
