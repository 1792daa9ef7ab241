// Package savecompat checks that the fork, used without a shared base,
// writes checkpoints byte-identical to upstream gVisor at the same pin.
package savecompat

import (
	"bytes"
	"github.com/forkvisor/forkvisor/internal/prereq"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the forkvisor checkout (this package lives in test/savecompat).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildPgsave builds ./test/savecompat/pgsave; if tree is not empty, against
// that gVisor tree instead of the pinned upstream module.
func buildPgsave(t *testing.T, root, tree, out string) {
	t.Helper()
	args := []string{"build", "-o", out}
	if tree != "" {
		dir := t.TempDir()
		mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		mod = append(mod, []byte("\nreplace gvisor.dev/gvisor => "+tree+"\n")...)
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), mod, 0644); err != nil {
			t.Fatal(err)
		}
		sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-modfile="+filepath.Join(dir, "go.mod"))
	}
	args = append(args, "./test/savecompat/pgsave")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func runPgsave(t *testing.T, bin string) map[string][]byte {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command(bin, dir).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	files := map[string][]byte{}
	for _, name := range []string{"sync.img", "async-meta.img", "async-pages.img"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	return files
}

func TestForkSavesLikeUpstreamWithoutBase(t *testing.T) {
	root := repoRoot(t)
	tree := filepath.Join(root, "build", "gvisor")
	if _, err := os.Stat(filepath.Join(tree, "go.mod")); err != nil {
		prereq.Missing(t, "no materialized fork at %s (run `make tree`): %v", tree, err)
	}
	bins := t.TempDir()
	upstream, fork := filepath.Join(bins, "pgsave-upstream"), filepath.Join(bins, "pgsave-fork")
	buildPgsave(t, root, "", upstream)
	buildPgsave(t, root, tree, fork)

	want := runPgsave(t, upstream)
	// The comparison means something only if upstream itself is repeatable
	// and the image is not trivial.
	again := runPgsave(t, upstream)
	for name, b := range want {
		if !bytes.Equal(b, again[name]) {
			t.Fatalf("upstream %s differs between two runs; the comparison would be meaningless", name)
		}
	}
	if len(want["sync.img"]) < 100<<10 || len(want["async-pages.img"]) == 0 {
		t.Fatalf("images too small to mean anything: sync %d bytes, pages %d bytes", len(want["sync.img"]), len(want["async-pages.img"]))
	}

	got := runPgsave(t, fork)
	for name, b := range want {
		if !bytes.Equal(got[name], b) {
			t.Errorf("%s: fork wrote %d bytes, upstream %d bytes; they differ", name, len(got[name]), len(b))
		} else {
			t.Logf("%s: %d bytes, identical", name, len(b))
		}
	}
}
