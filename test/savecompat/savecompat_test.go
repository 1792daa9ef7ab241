// Package savecompat checks that the fork, used without a shared base,
// writes checkpoints byte-identical to upstream gVisor at the same pin.
package savecompat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkvisor/forkvisor/internal/prereq"
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
	buildTool(t, root, tree, out, "./test/savecompat/pgsave")
}

// buildTool builds pkg (with the forkvisor build tag); if tree is not empty,
// against that gVisor tree instead of the pinned upstream module.
func buildTool(t *testing.T, root, tree, out, pkg string) {
	t.Helper()
	args := []string{"build", "-tags", "forkvisor", "-o", out}
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
	args = append(args, pkg)
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
	tree := forkTree(t, root)
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

// forkTree returns the materialized fork, or reports it missing.
func forkTree(t *testing.T, root string) string {
	t.Helper()
	tree := filepath.Join(root, "build", "gvisor")
	if _, err := os.Stat(filepath.Join(tree, "go.mod")); err != nil {
		prereq.Missing(t, "no materialized fork at %s (run `make tree`): %v", tree, err)
	}
	return tree
}

// TestUpstreamRefusesForkFormat saves a MemoryFile against a shared base
// (metadata Version 2) and a filestore as external content (Version 3) with
// the fork, and loads them with pristine upstream's loader: upstream must
// refuse each, naming its version, rather than load pages at the wrong
// offsets or as zeroes. Upstream's own image loads (so the refusal is the
// format's).
func TestUpstreamRefusesForkFormat(t *testing.T) {
	root := repoRoot(t)
	tree := forkTree(t, root)
	bins := t.TempDir()
	upstream, forkBase := filepath.Join(bins, "pgsave-upstream"), filepath.Join(bins, "pgsavebase-fork")
	buildPgsave(t, root, "", upstream)
	buildTool(t, root, tree, forkBase, "./test/savecompat/pgsavebase")

	dir := t.TempDir()
	if out, err := exec.Command(forkBase, dir).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", forkBase, err, out)
	}
	if out, err := exec.Command(upstream, dir).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", upstream, err, out)
	}
	if out, err := exec.Command(upstream, "-load", filepath.Join(dir, "sync.img")).CombinedOutput(); err != nil {
		t.Fatalf("upstream cannot load its own image: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		image   string
		version int
	}{
		{"base-sync.img", 2},
		{"external-sync.img", 3},
	} {
		out, err := exec.Command(upstream, "-load", filepath.Join(dir, tc.image)).CombinedOutput()
		var exit *exec.ExitError
		if want := fmt.Sprintf("unsupported MemoryFileMetadataProto version %d", tc.version); !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(string(out), want) {
			t.Fatalf("upstream loading the fork's %s: %v\n%s\nwant a refusal of version %d", tc.image, err, out, tc.version)
		}
		t.Logf("upstream refuses %s: %s", tc.image, strings.TrimSpace(string(out)))
	}
}
