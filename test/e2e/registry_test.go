package e2e

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/ociregistry"
	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// startRegistry starts Debian's docker-registry on loopback, requiring basic
// authentication, and returns it with a DOCKER_CONFIG directory that holds
// its credentials.
func startRegistry(t *testing.T) (*ociregistry.Registry, string) {
	t.Helper()
	reg := ociregistry.StartForTest(t, repoRoot, "fleet", "parked-sandboxes")
	dockerConfig := filepath.Join(t.TempDir(), "docker")
	if err := reg.WriteDockerConfig(dockerConfig); err != nil {
		t.Fatal(err)
	}
	return reg, dockerConfig
}

// ociTool runs bin/forkvisor-oci with DOCKER_CONFIG=dockerConfig.
func ociTool(t *testing.T, dockerConfig string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary(t, "forkvisor-oci"), append([]string{"--plain-http"}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+dockerConfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// countBefore returns the number printed right before word in out.
func countBefore(t *testing.T, out, word string) int {
	t.Helper()
	m := regexp.MustCompile(`(\d+) ` + regexp.QuoteMeta(word)).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no count of %q in:\n%s", word, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestRegistryPushPull parks a sandbox on "node A" (one runsc root and base
// store), pushes it to a real registry on loopback, pulls it on "node B"
// (another root, a cold store) and restores clones there; then checks that
// a second pull fetches no base, that a tampered block is refused with
// nothing stored, and that a registry that went away gives a clear error.
// Node A restores once before it pushes, so the artifact carries the base's
// learned write set: node B's first restore applies it instead of learning
// its own.
func TestRegistryPushPull(t *testing.T) {
	reg, dockerConfig := startRegistry(t)
	// Node A keeps its store on another filesystem than its images (a
	// tmpfs): the image then references the base by digest only, and push
	// reads it from the store.
	src := startSource(t, "runsc", 32)
	src.r.BaseStore = filepath.Join(t.TempDir(), "store")
	if err := os.MkdirAll(src.r.BaseStore, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", src.r.BaseStore).CombinedOutput(); err != nil {
		t.Fatalf("mounting a tmpfs for node A's store: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", src.r.BaseStore).Run() })
	p := src.park(t, filepath.Join(src.dir, "image"), "--shared-base")
	if _, err := os.Stat(filepath.Join(p.image, "base.img")); err == nil {
		t.Fatalf("node A's image holds base.img although its store is on another filesystem")
	}
	ref := reg.Addr + "/forkvisor/tick:v1"
	wantWriteSet := learnBeforePush(t, p)

	// Credentials come from the Docker configuration file only.
	if out, err := ociTool(t, t.TempDir(), "--base-store", p.r.StorePath(), "push", p.image, ref); err == nil || !strings.Contains(out, "no credentials for "+reg.Addr) {
		t.Errorf("push without credentials: %v: %s", err, out)
	}
	out, err := ociTool(t, dockerConfig, "--base-store", p.r.StorePath(), "push", p.image, ref)
	if err != nil {
		t.Fatalf("push: %v: %s", err, out)
	}
	t.Logf("push:\n%s", out)
	if !strings.Contains(out, "pushed with the checkpoint") {
		t.Errorf("push did not carry the write set that node A learned:\n%s", out)
	}
	blocks, zero := countBefore(t, out, "blocks"), countBefore(t, out, "zero")
	// The base spans the sandbox's memory file; a 32 MiB heap fills at least
	// 16 of its 2 MiB blocks, and most of the rest is zero.
	if pushed := countBefore(t, out, "uploaded;"); zero == 0 || pushed < 16 || pushed != blocks-zero {
		t.Errorf("push of a 32 MiB heap: %d blocks, %d zero, %d uploaded; want every non-zero block (at least 16) uploaded once, no zero block", blocks, zero, pushed)
	}
	// The same base again: nothing of it is uploaded.
	if out, err := ociTool(t, dockerConfig, "--base-store", p.r.StorePath(), "push", p.image, reg.Addr+"/forkvisor/tick:v2"); err != nil || countBefore(t, out, "uploaded;") != 0 {
		t.Errorf("second push of the same base: %v:\n%s", err, out)
	}

	// Node B: a cold store; the pull verifies every block and stores the base.
	dirB := t.TempDir()
	nodeB := &sandbox.Runsc{Bin: p.r.Bin, Root: filepath.Join(dirB, "root")}
	t.Cleanup(nodeB.Cleanup)
	pull := func(store, image string) (string, error) {
		return ociTool(t, dockerConfig, "--base-store", store, "--runsc", p.r.Bin, "pull", ref, image)
	}
	imageB := filepath.Join(dirB, "image")
	out, err = pull(nodeB.StorePath(), imageB)
	if err != nil {
		t.Fatalf("pull: %v: %s", err, out)
	}
	t.Logf("pull:\n%s", out)
	if !strings.Contains(out, "base write set: installed") {
		t.Errorf("pull did not install the write set that came with the checkpoint:\n%s", out)
	}
	if got := countBefore(t, out, "fetched and verified"); got != blocks-zero {
		t.Errorf("pull fetched %d blocks; want the %d non-zero ones", got, blocks-zero)
	}
	m := regexp.MustCompile(`base (sha256:[0-9a-f]{64})`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("pull printed no base digest:\n%s", out)
	}
	digest := m[1]
	stored := nodeB.StoredBase(digest)
	if st1, err1 := os.Stat(filepath.Join(imageB, "base.img")); err1 != nil {
		t.Errorf("pulled image has no base.img linked from the store: %v", err1)
	} else if st2, err2 := os.Stat(stored); err2 != nil || !os.SameFile(st1, st2) {
		t.Errorf("pulled image's base.img is not the stored base (%v)", err2)
	}
	if out, err := nodeB.Exec("bases", "verify", digest); err != nil {
		t.Errorf("bases verify on node B: %v: %s", err, out)
	}
	// The pulled image holds on to its base.
	if _, err := nodeB.Exec("bases", "remove", digest); err == nil || !strings.Contains(err.Error(), "still used") {
		t.Errorf("bases remove of a pulled image's base: %v", err)
	}
	if out, err := nodeB.Exec("bases", "--min-age=0", "gc"); err != nil || strings.Contains(out, "removed sha256") {
		t.Errorf("bases gc removed a pulled image's base: %q, %v", out, err)
	}
	if got, err := os.ReadFile(nodeB.WriteSetPath(imageB)); err != nil || string(got) != string(wantWriteSet) {
		t.Errorf("node B's write set for the base: %d bytes (%v), want node A's %d bytes", len(got), err, len(wantWriteSet))
	}
	b := &parked{r: nodeB, dir: dirB, bundle: p.bundle, image: imageB, lastTick: p.lastTick}
	logs := filepath.Join(dirB, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	nodeB.LogDir = logs
	b.restoreClone(t, "b1", imageB, p.lastTick)
	nodeB.LogDir = ""
	if !logsContain(t, logs, "applying a write set") || logsContain(t, logs, "Learning the write set") {
		t.Errorf("node B's first restore should apply the write set that came with the pull, not learn one (debug logs in %s)", logs)
	}
	b.restoreClone(t, "b2", imageB, p.lastTick)
	nodeB.Destroy("b2")

	// A second pull on node B fetches the checkpoint files only, and
	// restores.
	image2 := filepath.Join(dirB, "image2")
	if out, err := pull(nodeB.StorePath(), image2); err != nil || !strings.Contains(out, "already stored, nothing fetched") {
		t.Errorf("second pull on node B: %v:\n%s", err, out)
	}
	b.restoreClone(t, "b3", image2, p.lastTick)
	nodeB.Destroy("b3")

	// A clone parked again on node B (its image references the base in B's
	// store) is pushed from there: a second checkpoint of the same base,
	// on a registry that does not allow deletes.
	repark := filepath.Join(dirB, "repark")
	if err := nodeB.Checkpoint("b1", repark, "--shared-base"); err != nil {
		t.Fatal(err)
	}
	nodeB.Destroy("b1")
	ref3 := reg.Addr + "/forkvisor/tick:v3"
	if out, err := ociTool(t, dockerConfig, "--base-store", nodeB.StorePath(), "push", repark, ref3); err != nil || countBefore(t, out, "uploaded;") != 0 {
		t.Errorf("push of a re-parked clone: %v:\n%s", err, out)
	}
	if out, err := ociTool(t, dockerConfig, "--base-store", nodeB.StorePath(), "--runsc", p.r.Bin, "pull", ref3, filepath.Join(dirB, "image3")); err != nil || !strings.Contains(out, "already stored") {
		t.Errorf("pull of the re-parked clone: %v:\n%s", err, out)
	}

	// A tampered block in the registry: refused, nothing stored or written.
	bm := manifestOf(t, src.r.StoredBase(digest))
	victim := -1
	for i := range bm.Blocks {
		if !bm.Zero(i) {
			victim = i
			break
		}
	}
	flipByteAt(t, reg.BlobPath(bm.Blocks[victim]), 12345)
	storeC, imageC := filepath.Join(t.TempDir(), "store"), filepath.Join(t.TempDir(), "image")
	out, err = pull(storeC, imageC)
	if err == nil || !strings.Contains(out, "base block") || !strings.Contains(out, bm.Blocks[victim]) || !strings.Contains(out, ref) {
		t.Errorf("pull of a tampered block: %v; want an error naming the block and the reference:\n%s", err, out)
	}
	assertNoPull(t, storeC, imageC, digest)
	flipByteAt(t, reg.BlobPath(bm.Blocks[victim]), 12345)

	// The registry went away: a clear error, nothing written.
	reg.Stop()
	storeD, imageD := filepath.Join(t.TempDir(), "store"), filepath.Join(t.TempDir(), "image")
	out, err = pull(storeD, imageD)
	if err == nil || !strings.Contains(out, ref) || !strings.Contains(out, "connection refused") {
		t.Errorf("pull from a stopped registry: %v:\n%s", err, out)
	}
	assertNoPull(t, storeD, imageD, digest)
}

// assertNoPull checks that a failed pull left no image directory and no
// stored base (and no temporary files) behind.
func assertNoPull(t *testing.T, store, image, digest string) {
	t.Helper()
	if _, err := os.Stat(image); err == nil {
		t.Errorf("failed pull created %s", image)
	}
	if _, err := os.Stat(filepath.Join(store, "sha256", strings.TrimPrefix(digest, "sha256:"))); err == nil {
		t.Errorf("failed pull stored base %s", digest)
	}
	if left, _ := filepath.Glob(filepath.Join(store, ".pull-*")); len(left) != 0 {
		t.Errorf("failed pull left %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(image), ".*.pull-*")); len(left) != 0 {
		t.Errorf("failed pull left %v", left)
	}
}

// manifestOf returns the block manifest of the base file at path.
func manifestOf(t *testing.T, path string) *blockmanifest.Manifest {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := blockmanifest.Build(f, uint64(st.Size()), nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// learnBeforePush restores one clone of p on its node and waits for the
// write set that this first restore learns, so that a push of p's image
// carries it; it returns the set, after checking it with writeset.Check
// against the image's base.json (the tools' check of a write set must
// accept what runsc writes).
func learnBeforePush(t *testing.T, p *parked) []byte {
	t.Helper()
	p.restoreClone(t, "a-learn", p.image, p.lastTick)
	waitWriteSet(t, p.r.WriteSetPath(p.image))
	p.r.Destroy("a-learn")
	ws, err := os.ReadFile(p.r.WriteSetPath(p.image))
	if err != nil {
		t.Fatal(err)
	}
	var base struct {
		Length uint64 `json:"length"`
		SHA256 string `json:"sha256"`
	}
	if b, err := os.ReadFile(filepath.Join(p.image, "base.json")); err != nil || json.Unmarshal(b, &base) != nil {
		t.Fatalf("base.json of %s: %v", p.image, err)
	}
	id, err := hex.DecodeString(base.SHA256)
	if err != nil {
		t.Fatalf("base.json of %s: %v", p.image, err)
	}
	if err := writeset.Check(ws, base.Length, id); err != nil {
		t.Errorf("the write set that runsc learned (%d bytes) fails writeset.Check: %v", len(ws), err)
	}
	return ws
}
