package e2e

import (
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/lazybase"
	"github.com/forkvisor/forkvisor/internal/sandbox"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// TestRegistryLazyRestore parks a sandbox on "node A", pushes it to a real
// registry on loopback, and restores 4 clones on a cold "node B" before its
// base has arrived: node B's lazy fetcher fetches each block on first touch,
// once for all clones, and only the blocks the clones touch. Then a tampered
// block is refused at its first touch and a stopped registry gives errors,
// and neither ever shows a clone wrong bytes. Node A restores once before it
// pushes, so the artifact carries the base's learned write set, which node B
// (whose base is read-only, so it cannot learn one) applies.
func TestRegistryLazyRestore(t *testing.T) {
	reg, dockerConfig := startRegistry(t)
	// 64 MiB heap, 1 MiB of it checked per 50 ms tick: a clone's first
	// tick touches little of the base, a full pass takes about 3 s.
	src := startSource(t, "runsc", 64, "-check-mib", "1")
	p := src.park(t, filepath.Join(src.dir, "image"), "--shared-base")
	ref := reg.Addr + "/forkvisor/lazy:v1"
	wantWriteSet := learnBeforePush(t, p)
	if out, err := ociTool(t, dockerConfig, "--base-store", p.r.StorePath(), "push", p.image, ref); err != nil || !strings.Contains(out, "pushed with the checkpoint") {
		t.Fatalf("push (with the write set that node A learned): %v: %s", err, out)
	}

	dirB := t.TempDir()
	nodeB := &sandbox.Runsc{Bin: p.r.Bin, Root: filepath.Join(dirB, "root")}
	t.Cleanup(nodeB.Cleanup)
	store := nodeB.StorePath()
	if err := os.MkdirAll(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := lazybase.Start(binary(t, "forkvisor-oci"), store, []string{"DOCKER_CONFIG=" + dockerConfig}, filepath.Join(dirB, "lazyd.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)

	imageB := filepath.Join(dirB, "image")
	out, err := ociTool(t, dockerConfig, "--base-store", store, "--runsc", p.r.Bin, "--lazy", "pull", ref, imageB)
	if err != nil || !strings.Contains(out, "left to the lazy fetcher") || !strings.Contains(out, "base write set: installed") {
		t.Fatalf("pull --lazy (which hands the write set to the lazy fetcher): %v:\n%s", err, out)
	}
	t.Logf("pull --lazy:\n%s", out)
	m := regexp.MustCompile(`base sha256:([0-9a-f]{64})`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("pull printed no base digest:\n%s", out)
	}
	hex := m[1]
	if _, err := os.Stat(filepath.Join(imageB, "base.img")); err == nil {
		t.Errorf("a lazy pull linked base.img into the image")
	}
	if _, err := os.Stat(nodeB.StoredBase(hex)); err == nil {
		t.Errorf("a lazy pull stored the base")
	}
	if got, err := os.ReadFile(filepath.Join(filepath.Dir(lazybase.Path(store, hex)), "base.writeset")); err != nil || string(got) != string(wantWriteSet) {
		t.Errorf("the lazy fetcher serves a write set of %d bytes (%v), want node A's %d bytes", len(got), err, len(wantWriteSet))
	}

	// The block manifest, from node A's copy of the base.
	bm := manifestOf(t, p.r.StoredBase(hex))

	// The pull fetched, through the lazy fetcher, exactly the non-zero
	// blocks that the write set touches (every restore copies those
	// first), and no others.
	wsBlocks := writeSetBlocks(t, wantWriteSet, bm, hex)
	if want := fmt.Sprintf("base write set's blocks, through the lazy fetcher: %d blocks (", len(wsBlocks)); !strings.Contains(out, want) {
		t.Errorf("pull --lazy should say %q:\n%s", want, out)
	}
	pulled := map[int]bool{}
	var pulledBytes int64
	for _, f := range mustFetches(t, store, hex) {
		pulled[f.Block] = true
		pulledBytes += f.Bytes
	}
	if !maps.Equal(pulled, wsBlocks) {
		t.Errorf("a lazy pull fetched blocks %v, want the write set's %v", slices.Sorted(maps.Keys(pulled)), slices.Sorted(maps.Keys(wsBlocks)))
	}
	var nonZero int64
	for i := range bm.Blocks {
		if !bm.Zero(i) {
			_, n := bm.Range(i)
			nonZero += int64(n)
		}
	}

	// 4 clones restored on node B: correct, each block fetched once, and
	// the first clone's first tick far less than the base. (The bound is
	// taken at the first clone's first tick: a running clone goes on
	// checking its heap, 1 MiB per tick, while the others restore, so what
	// has been fetched after the fourth depends on how long restores take.
	// Up to maxPrefetches prefetches may still be in flight then, so the
	// bound leaves room for them: 8 MiB.)
	b := &parked{r: nodeB, dir: dirB, bundle: p.bundle, image: imageB, lastTick: p.lastTick}
	outs := map[string]string{}
	fetchedBytes := func() (n int64) {
		for _, f := range mustFetches(t, store, hex) {
			n += f.Bytes
		}
		return n
	}
	logs := filepath.Join(dirB, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b1", "b2", "b3", "b4"} {
		if id == "b1" {
			nodeB.LogDir = logs
		}
		outs[id] = b.restoreClone(t, id, imageB, p.lastTick)
		nodeB.LogDir = ""
		if id != "b1" {
			continue
		}
		if !logsContain(t, logs, "Applying write set") || !logsContain(t, logs, "applying a write set") {
			t.Errorf("the first clone on node B should apply the write set that came with the pull (debug logs in %s)", logs)
		}
		first := fetchedBytes()
		t.Logf("at the first clone's first tick: %.1f MiB fetched of %.1f MiB of non-zero base (%d blocks of %.1f MiB), %.1f MiB of it by the pull",
			float64(first)/(1<<20), float64(nonZero)/(1<<20), len(bm.Blocks), float64(bm.Length)/(1<<20), float64(pulledBytes)/(1<<20))
		if first > nonZero/2-8<<20 {
			t.Errorf("the first clone's first tick fetched %d bytes (%d of them by the pull); want at most half of the base's %d non-zero bytes less 8 MiB that prefetches in flight may add", first, pulledBytes, nonZero)
		}
	}
	fetches := mustFetches(t, store, hex)
	seen := map[int]bool{}
	var fetched int64
	for _, f := range fetches {
		if seen[f.Block] {
			t.Errorf("block %d fetched more than once", f.Block)
		}
		seen[f.Block] = true
		fetched += f.Bytes
		if bm.Zero(f.Block) {
			t.Errorf("known-zero block %d was fetched", f.Block)
		}
	}
	t.Logf("after 4 clones' first ticks: %d blocks, %.1f MiB fetched", len(fetches), float64(fetched)/(1<<20))
	// The clones read blocks that the pull did not fetch: the tick checks
	// its heap after each line, 1 MiB a tick. (Not asserted at the first
	// clone's first tick: the tick prints that line before it checks
	// anything, so whether the first check has begun by then is a race.)
	if fetched <= pulledBytes {
		t.Errorf("4 clones running their ticks fetched %d bytes, all of them by the pull (%d): want blocks fetched on demand", fetched, pulledBytes)
	}
	for _, id := range []string{"b1", "b2", "b3", "b4"} {
		nodeB.Destroy(id)
	}
	// Prefetches in flight finish (a fetch log that stays the same for a
	// second) before the fetched blocks are taken.
	seen = map[int]bool{}
	for n := -1; n != len(seen); time.Sleep(time.Second) {
		n = len(seen)
		for _, f := range mustFetches(t, store, hex) {
			seen[f.Block] = true
		}
	}

	// Every block that no clone has fetched is tampered with in the
	// registry (blocks with equal content are one blob: flip each blob
	// once). A new clone ticks (its first tick reads what the first clones
	// read), and its check pass then reaches the tampered blocks within a
	// few seconds: the fetcher refuses each at its first touch, and the
	// clone dies of SIGBUS instead of reading wrong bytes.
	fetchedDigests := map[string]bool{}
	for i := range seen {
		fetchedDigests[bm.Blocks[i]] = true
	}
	flipped := map[string]bool{}
	for i := range bm.Blocks {
		if dg := bm.Blocks[i]; !bm.Zero(i) && !fetchedDigests[dg] && !flipped[dg] {
			flipByteAt(t, reg.BlobPath(dg), 4096)
			flipped[dg] = true
		}
	}
	if len(flipped) == 0 {
		t.Fatalf("every non-zero block was fetched by the first ticks")
	}
	refused := regexp.MustCompile(`block (\d+) of base sha256:` + hex + ` from ` + regexp.QuoteMeta(reg.Addr+"/forkvisor/lazy") + ` does not match the block manifest .*; refused`)
	outs["b5"] = b.restoreClone(t, "b5", imageB, p.lastTick)
	if line, _, err := sandbox.WaitForLine(d.Log, 0, 30*time.Second, refused.MatchString); err != nil {
		t.Errorf("no tampered block refused within 30 s: %v\n%s", err, readFile(t, d.Log))
	} else {
		t.Logf("tampered block: %s", line)
	}
	waitStopped(t, nodeB, "b5")
	for _, f := range mustFetches(t, store, hex) {
		if flipped[f.Digest] {
			t.Errorf("tampered block %d (%s) was accepted", f.Block, f.Digest)
		}
	}
	for dg := range flipped {
		flipByteAt(t, reg.BlobPath(dg), 4096)
	}
	nodeB.Destroy("b5")
	// lazyd fails a block whose load failed less than FailureBackoff ago
	// at once, with that failure: let the tampered blocks' failures age,
	// so that the next clone's reads ask the registry.
	time.Sleep(lazybase.FailureBackoff + time.Second)

	// The registry goes away: a clone restored now fails at its first read
	// of a block not fetched yet, with an error naming the block and the
	// reference, never with zeros.
	reg.Stop()
	outs["b6"] = b.restoreClone(t, "b6", imageB, p.lastTick)
	unreachable := regexp.MustCompile(`block \d+ \(sha256:[0-9a-f]{64}\) of base sha256:` + hex + ` from ` + regexp.QuoteMeta(reg.Addr+"/forkvisor/lazy") + `: .*connection refused`)
	if line, _, err := sandbox.WaitForLine(d.Log, 0, 60*time.Second, unreachable.MatchString); err != nil {
		t.Errorf("no clear error within 60 s of the registry stopping: %v\n%s", err, readFile(t, d.Log))
	} else {
		t.Logf("registry stopped: %s", line)
	}
	waitStopped(t, nodeB, "b6")
	for id, o := range outs {
		lines := sandbox.Lines(o)
		for _, l := range lines {
			if strings.Contains(l, "sum=BAD") {
				t.Errorf("clone %s saw wrong bytes: %q", id, l)
			}
		}
		t.Logf("clone %s: %d lines, the last: %q", id, len(lines), lines[max(0, len(lines)-2):])
	}
}

// waitStopped waits up to 30 s for container id to stop (its workload died).
func waitStopped(t *testing.T, r *sandbox.Runsc, id string) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, _ = r.Exec("state", id)
		if strings.Contains(out, `"status": "stopped"`) {
			return
		}
	}
	t.Errorf("clone %s still runs 30 s after its base became unreadable: %s", id, out)
}

func mustFetches(t *testing.T, store, hex string) []lazybase.Fetch {
	t.Helper()
	fs, err := lazybase.Fetches(store, hex)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, _ := os.ReadFile(path)
	return string(b)
}

// writeSetBlocks returns the non-zero blocks of the base (manifest bm, root
// hexRoot) that the write set ws touches.
func writeSetBlocks(t *testing.T, ws []byte, bm *blockmanifest.Manifest, hexRoot string) map[int]bool {
	t.Helper()
	id, err := hex.DecodeString(hexRoot)
	if err != nil {
		t.Fatal(err)
	}
	ranges, err := writeset.Ranges(ws, bm.Length, id)
	if err != nil {
		t.Fatalf("node A's write set: %v", err)
	}
	blocks := map[int]bool{}
	for _, i := range writeset.Blocks(ranges, blockmanifest.BlockSize) {
		if !bm.Zero(int(i)) {
			blocks[int(i)] = true
		}
	}
	return blocks
}
