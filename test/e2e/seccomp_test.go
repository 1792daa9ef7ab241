package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestSeccompFiltersPrecompiled runs, parks and restores a sandbox with each
// runsc that the benchmarks compare (the fork's park with --shared-base,
// whose restore selects a filter of its own, upstream's a plain checkpoint)
// and requires the sentry and the gofer of both the run and the restore to
// install a precompiled seccomp program (tools/seccomp.sh), not to compile
// one at start: a build that lost a program would make that runtime's
// starts or restores slower alone, and the comparisons unfair. The fork's
// sandboxes must also render their systrap stubs' three programs from
// precompiled ones (patch 0049), which upstream's compiles at every start.
func TestSeccompFiltersPrecompiled(t *testing.T) {
	for _, test := range []struct {
		name      string
		parkFlags []string
	}{
		{name: "runsc", parkFlags: []string{"--shared-base"}},
		{name: "runsc-upstream"},
	} {
		t.Run(test.name, func(t *testing.T) {
			r, dir := newRoot(t, binary(t, test.name))
			r.Upstream = test.name == "runsc-upstream"
			r.LogDir = filepath.Join(dir, "logs")
			if err := os.MkdirAll(r.LogDir, 0o755); err != nil {
				t.Fatal(err)
			}
			src := &source{r: r, dir: dir, bundle: filepath.Join(dir, "bundle"), out: filepath.Join(dir, "source.out")}
			if err := sandbox.NewBundle(src.bundle, tickBin, "-mib", "1", "-interval", "50ms"); err != nil {
				t.Fatal(err)
			}
			if _, err := r.RunUntilTick(src.bundle, "source", src.out, 3, nil); err != nil {
				t.Fatal(err)
			}
			p := src.park(t, filepath.Join(dir, "image"), test.parkFlags...)
			p.restoreClone(t, "clone", p.image, p.lastTick)
			r.Destroy("clone")
			for _, process := range []string{"boot", "gofer"} {
				logs, err := filepath.Glob(filepath.Join(r.LogDir, "*."+process+".txt"))
				if err != nil || len(logs) != 2 {
					t.Fatalf("want the %s logs of the run and of the restore in %s, got %q (%v)", process, r.LogDir, logs, err)
				}
				for _, l := range logs {
					b, err := os.ReadFile(l)
					if err != nil {
						t.Fatal(err)
					}
					if s := string(b); !strings.Contains(s, "Loaded precompiled seccomp instructions") || strings.Contains(s, "No precompiled program found") {
						t.Errorf("%s: the %s should install a precompiled seccomp program, not build one at start", l, process)
					}
					if process != "boot" {
						continue
					}
					// The fork's systrap renders its stubs' programs
					// from precompiled ones (patch 0049); upstream's
					// compiles them.
					for _, stub := range []string{"stub process", "sysmsg threads", "syscall notify"} {
						rendered := false
						for _, line := range strings.Split(string(b), "\n") {
							if strings.Contains(line, "Rendered the precompiled seccomp program") && strings.Contains(line, "systrap "+stub+`"`) {
								rendered = true
							}
						}
						if rendered != !r.Upstream {
							t.Errorf("%s: the systrap stubs' %q program rendered from a precompiled one: %t, want %t", l, stub, rendered, !r.Upstream)
						}
					}
				}
			}
		})
	}
}
