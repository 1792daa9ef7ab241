package lazybase

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/prereq"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// fakeRegistry serves blocks by digest and counts fetches.
type fakeRegistry struct {
	mu      sync.Mutex
	blobs   map[string][]byte
	fetches map[string]int
	down    bool // protected by mu
}

func (r *fakeRegistry) setDown(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
}

func (r *fakeRegistry) flip(dg string, off int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.blobs[dg][off] ^= 0xff
}

func (r *fakeRegistry) fetch(ctx context.Context, dg string, size int64) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return nil, errors.New("connection refused")
	}
	r.fetches[dg]++
	b, ok := r.blobs[dg]
	if !ok {
		return nil, fmt.Errorf("%s: not found", dg)
	}
	// Like oras, a blob that does not hash to its digest is refused.
	if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != dg {
		return nil, fmt.Errorf("%w: mismatched digest", ErrMismatch)
	}
	return append([]byte(nil), b...), nil
}

// newBase returns a base of 6 blocks: 0, 1 and 4 hold data (4 repeats 1),
// 2 and 3 are zero, 5 is a short last block with data.
func newBase(t *testing.T) ([]byte, *blockmanifest.Manifest, *fakeRegistry) {
	t.Helper()
	data := make([]byte, 5*blockmanifest.BlockSize+64<<10)
	for i := range data[:2*blockmanifest.BlockSize] {
		data[i] = byte(i*7 + i>>12)
	}
	copy(data[4*blockmanifest.BlockSize:], data[blockmanifest.BlockSize:2*blockmanifest.BlockSize])
	copy(data[5*blockmanifest.BlockSize:], []byte("the last, short block"))
	m, reg := baseOf(t, data)
	return data, m, reg
}

// baseOf returns the block manifest of a base holding data, and a fake
// registry that serves its blocks.
func baseOf(t *testing.T, data []byte) (*blockmanifest.Manifest, *fakeRegistry) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "base.img")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reg := &fakeRegistry{blobs: map[string][]byte{}, fetches: map[string]int{}}
	m, err := blockmanifest.Build(f, uint64(len(data)), func(i int, block []byte, sum [sha256.Size]byte) error {
		reg.blobs["sha256:"+hex.EncodeToString(sum[:])] = append([]byte(nil), block...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// registeredBase returns newBase's base registered in a new store root.
func registeredBase(t *testing.T) ([]byte, *blockmanifest.Manifest, *fakeRegistry, string) {
	t.Helper()
	data, m, reg := newBase(t)
	root := t.TempDir()
	if err := Register(root, m, Source{Reference: "registry.test/base"}); err != nil {
		t.Fatal(err)
	}
	return data, m, reg, root
}

func serve(t *testing.T, root string, reg *fakeRegistry) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Missing(t, "mounting the lazy fetcher's FUSE filesystem needs root")
	}
	s, err := Serve(root, func(Source) (FetchFunc, error) { return reg.fetch, nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unmount() })
	return s
}

func TestServeFetchesOnFirstTouch(t *testing.T) {
	data, m, reg, root := registeredBase(t)
	s := serve(t, root, reg)
	hexRoot := m.Digest[len("sha256:"):]
	path := Path(root, hexRoot)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != int64(len(data)) || st.Mode().Perm() != 0o400 {
		t.Fatalf("stat %s = %v, %v; want %d bytes, mode 0400", path, st, err, len(data))
	}
	if _, err := os.OpenFile(path, os.O_RDWR, 0); !errors.Is(err, syscall.EROFS) {
		t.Errorf("opening the base for writing: %v, want EROFS", err)
	}
	// Nothing is fetched until a read.
	if st := s.Stats(); st.BlocksFetched != 0 {
		t.Fatalf("%d blocks fetched before any read", st.BlocksFetched)
	}
	// Many readers of one block at once: one fetch.
	var wg sync.WaitGroup
	var bad atomic.Int32
	for r := 0; r < 8; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			if _, err := f.ReadAt(buf, int64(r)*8192+100); err != nil || !bytes.Equal(buf, data[r*8192+100:][:4096]) {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d concurrent readers got wrong bytes", bad.Load())
	}
	// The first fetch of block 0 may start a prefetch of its neighbour,
	// which counts in the statistics and may still be in flight: count the
	// fetches of block 0 that the fetch log recorded (before the readers
	// returned).
	early, err := Fetches(root, hexRoot)
	if err != nil {
		t.Fatal(err)
	}
	if got := fetchesOf(early, 0); got != 1 {
		t.Errorf("8 readers of block 0: %d fetches of it, want 1 (fetch log %v)", got, early)
	}
	// The whole file reads back exactly; zero blocks are never fetched, and
	// the repeated block is fetched for each place it appears at most once.
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("reading the whole base: %v (equal: %t)", err, bytes.Equal(got, data))
	}
	fetches, err := Fetches(root, hexRoot)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, e := range fetches {
		if m.Zero(e.Block) || seen[e.Block] {
			t.Errorf("block %d fetched (zero: %t, again: %t)", e.Block, m.Zero(e.Block), seen[e.Block])
		}
		seen[e.Block] = true
	}
	if len(seen) != 4 {
		t.Errorf("fetched blocks %v, want the 4 non-zero ones", seen)
	}
	// base.json is the publish record that runsc checks.
	rec, err := os.ReadFile(filepath.Join(root, MountDir, hexRoot, "base.json"))
	if want := fmt.Sprintf(`"sha256":"%s"`, hexRoot); err != nil || !bytes.Contains(rec, []byte(want)) || !bytes.Contains(rec, []byte(`"image":"base.img"`)) {
		t.Errorf("base.json = %s, %v", rec, err)
	}
	// An unregistered digest is not there.
	if _, err := os.Stat(Path(root, hex.EncodeToString(make([]byte, 32)))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of an unregistered base: %v, want ENOENT", err)
	}
}

func TestServeRefusesBadBlocks(t *testing.T) {
	data, m, reg, root := registeredBase(t)
	s := serve(t, root, reg)
	path := Path(root, m.Digest[len("sha256:"):])
	// Block 1's blob is tampered with: its reads fail, never return the
	// tampered bytes, and nothing of it is kept.
	reg.flip(m.Blocks[1], 5000)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, blockmanifest.BlockSize+4096); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of a tampered block: %v, want EIO", err)
	}
	if st := s.Stats(); st.Failures == 0 || st.BlocksFetched != 0 {
		t.Errorf("after a tampered block: %+v, want a failure and nothing fetched", st)
	}
	// Once the registry serves the right bytes, the block reads; with the
	// registry down, a block not fetched yet fails, a fetched one reads.
	reg.flip(m.Blocks[1], 5000)
	time.Sleep(FailureBackoff) // A failed block fails again at once until then.
	if _, err := f.ReadAt(buf, blockmanifest.BlockSize+4096); err != nil || !bytes.Equal(buf, data[blockmanifest.BlockSize+4096:][:4096]) {
		t.Errorf("read after the registry was repaired: %v", err)
	}
	reg.setDown(true)
	if _, err := f.ReadAt(buf, 5*blockmanifest.BlockSize); !errors.Is(err, syscall.EIO) {
		t.Errorf("read with the registry down: %v, want EIO", err)
	}
}

func TestServeReverifiesCacheAfterRestart(t *testing.T) {
	data, m, reg, root := registeredBase(t)
	hexRoot := m.Digest[len("sha256:"):]
	s := serve(t, root, reg)
	if got, err := os.ReadFile(Path(root, hexRoot)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("first read: %v", err)
	}
	if err := s.Unmount(); err != nil {
		t.Fatal(err)
	}
	// A block of the node cache is damaged while the fetcher is down: the
	// restarted fetcher finds the others there, verified, and fetches the
	// damaged one again.
	cache := filepath.Join(root, CacheDir, hexRoot, blocksName)
	cf, err := os.OpenFile(cache, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cf.WriteAt([]byte{0xee}, 100); err != nil {
		t.Fatal(err)
	}
	cf.Close()
	s2 := serve(t, root, reg)
	if got, err := os.ReadFile(Path(root, hexRoot)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after restart: %v", err)
	}
	if st := s2.Stats(); st.BlocksFetched != 1 || st.BlocksVerifiedLocal != 3 {
		t.Errorf("after restart: %+v, want block 0 fetched again and 3 blocks found in the node cache", st)
	}
}

func TestRegisterRefusesBadManifest(t *testing.T) {
	_, m, _ := newBase(t)
	bad := *m
	bad.Blocks = append([]string(nil), m.Blocks...)
	bad.Blocks[2] = m.Blocks[0] // no longer commits to its root
	root := t.TempDir()
	if err := Register(root, &bad, Source{Reference: "registry.test/base"}); err == nil {
		t.Errorf("Register of a manifest that does not match its root succeeded")
	}
	if err := Register(root, m, Source{}); err == nil {
		t.Errorf("Register without a reference succeeded")
	}
	if entries, _ := os.ReadDir(filepath.Join(root, CacheDir)); len(entries) != 0 {
		t.Errorf("failed registrations left %v", entries)
	}
}

// fetchesOf returns how many of fetches fetched block i.
func fetchesOf(fetches []Fetch, i int) int {
	n := 0
	for _, e := range fetches {
		if e.Block == i {
			n++
		}
	}
	return n
}

func TestPrefetchRange(t *testing.T) {
	for _, tc := range []struct {
		name     string
		i, n     int
		present  []int
		advised  []int // blocks of the served write set
		from, to int
	}{
		{name: "jump to the middle", i: 5, n: 10, from: 4, to: 6},
		{name: "going up", i: 5, n: 10, present: []int{4}, from: 6, to: 5 + prefetchBlocks},
		{name: "going down", i: 5, n: 10, present: []int{6}, from: 5 - prefetchBlocks, to: 4},
		{name: "filling a gap", i: 5, n: 10, present: []int{4, 6}, from: 7, to: 6 + prefetchBlocks},
		{name: "first block", i: 0, n: 10, from: -1, to: 1},
		{name: "first block, going down", i: 0, n: 10, present: []int{1}, from: -prefetchBlocks, to: -1},
		{name: "last block, going up", i: 9, n: 10, present: []int{8}, from: 10, to: 9 + prefetchBlocks},
		{name: "a write set block", i: 5, n: 10, advised: []int{5, 6}, from: 6, to: 5},
		{name: "a write set block, going up", i: 5, n: 10, present: []int{4}, advised: []int{4, 5}, from: 6, to: 5},
		{name: "next to a write set block", i: 5, n: 10, present: []int{4}, advised: []int{4}, from: 6, to: 5 + prefetchBlocks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from, to := prefetchRange(tc.i, tc.n, func(j int) bool { return slices.Contains(tc.present, j) }, func(j int) bool { return slices.Contains(tc.advised, j) })
			if from != tc.from || to != tc.to {
				t.Errorf("prefetchRange(%d, %d, present %v, advised %v) = [%d, %d], want [%d, %d]", tc.i, tc.n, tc.present, tc.advised, from, to, tc.from, tc.to)
			}
		})
	}
}

func TestRecentBlocksServeTheRestOfABlock(t *testing.T) {
	data, m, reg, root := registeredBase(t)
	s := serve(t, root, reg)
	hexRoot := m.Digest[len("sha256:"):]
	f, err := os.Open(Path(root, hexRoot))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// No readahead: each read below asks the fetcher for its own pages.
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, data[:4096]) {
		t.Fatalf("read of block 0: %v", err)
	}
	// The cache file's copy of block 0 is damaged after the fetch: the
	// rest of the block is still served, from the verified copy in
	// memory, without another fetch.
	cf, err := os.OpenFile(filepath.Join(root, CacheDir, hexRoot, blocksName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cf.WriteAt([]byte{^data[blockmanifest.BlockSize-100]}, blockmanifest.BlockSize-100); err != nil {
		t.Fatal(err)
	}
	cf.Close()
	tail := make([]byte, 4096)
	if _, err := f.ReadAt(tail, blockmanifest.BlockSize-4096); err != nil || !bytes.Equal(tail, data[blockmanifest.BlockSize-4096:blockmanifest.BlockSize]) {
		t.Fatalf("read of the end of block 0: %v", err)
	}
	// (Blocks 0, 1 and 4 have one digest: count block 0's fetches in the
	// fetch log, which the read above waited for.)
	fetches, err := Fetches(root, hexRoot)
	if err != nil {
		t.Fatal(err)
	}
	if n := fetchesOf(fetches, 0); n != 1 {
		t.Errorf("block 0 fetched %d times, want 1 (fetch log %+v)", n, fetches)
	}
	// The tail was read through the fetcher (not from the kernel's page
	// cache), and served from memory.
	if st := s.Stats(); st.BlocksFromMemory == 0 {
		t.Errorf("the read of the end of block 0 was not served from memory: %+v", st)
	}
}

func TestRecentBlocksBounded(t *testing.T) {
	r := newRecentBlocks()
	for i := 0; i <= recentCapacity; i++ {
		r.Add(recentKey{"a", i}, []byte{byte(i)})
	}
	if _, ok := r.Get(recentKey{"a", 0}); ok {
		t.Errorf("the least recent block was kept beyond %d", recentCapacity)
	}
	if got, _ := r.Get(recentKey{"a", recentCapacity}); len(got) != 1 || got[0] != recentCapacity {
		t.Errorf("the most recent block: %v", got)
	}
	if _, ok := r.Get(recentKey{"b", 1}); ok {
		t.Errorf("a block of another base was served")
	}
	// A block that was read is kept over one that was not, and adding a
	// kept block again does not add an entry.
	lru := newRecentBlocks()
	for i := 0; i < recentCapacity; i++ {
		lru.Add(recentKey{"a", i}, []byte{byte(i)})
	}
	lru.Get(recentKey{"a", 0})
	lru.Add(recentKey{"a", 5}, []byte{5})
	lru.Add(recentKey{"a", recentCapacity}, []byte{recentCapacity})
	_, kept0 := lru.Peek(recentKey{"a", 0})
	_, kept1 := lru.Peek(recentKey{"a", 1})
	if !kept0 || kept1 || lru.Len() != recentCapacity {
		t.Errorf("after reading block 0 and adding one: block 0 kept %t, block 1 kept %t, %d entries; want true, false, %d", kept0, kept1, lru.Len(), recentCapacity)
	}
}

// TestServeWriteSet checks that a write set added to a registered base is
// served beside it, read-only and as added, also when it arrives after the
// fetcher started serving the base; that the first one stands; and that a
// base without one serves none.
func TestServeWriteSet(t *testing.T) {
	_, m, reg, root := registeredBase(t)
	hexRoot := m.Digest[len("sha256:"):]
	// A second base, registered without a write set.
	other := filepath.Join(t.TempDir(), "other.img")
	if err := os.WriteFile(other, append([]byte("another base"), make([]byte, 4096-12)...), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m2, err := blockmanifest.Build(f, 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Register(root, m2, Source{Reference: "registry.test/base2"}); err != nil {
		t.Fatal(err)
	}
	serve(t, root, reg)
	path := filepath.Join(root, MountDir, hexRoot, writeSetName)
	// The fetcher serves the base before its write set arrives.
	if _, err := os.Stat(Path(root, hexRoot)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a write set not added yet: %v, want ENOENT", err)
	}
	ws := []byte("GVWRSET\x00 a write set")
	if ok, err := AddWriteSet(root, hexRoot, ws); !ok || err != nil {
		t.Fatalf("AddWriteSet = %v, %v; want true, nil", ok, err)
	}
	if ok, err := AddWriteSet(root, hexRoot, []byte("another")); ok || err != nil {
		t.Fatalf("AddWriteSet over the first = %v, %v; want false, nil", ok, err)
	}
	for _, tc := range []struct {
		name string
		hex  string
		data []byte
		want string
	}{
		{"unregistered base", hex.EncodeToString(make([]byte, 32)), ws, "not registered"},
		{"not a digest", "../x", ws, "not a sha256 hex digest"},
		{"empty", hexRoot, nil, "want 1 to"},
	} {
		if _, err := AddWriteSet(root, tc.hex, tc.data); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("AddWriteSet (%s) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, ws) {
		t.Fatalf("%s = %q, %v; want %q", path, got, err, ws)
	}
	if _, err := os.OpenFile(path, os.O_RDWR, 0); !errors.Is(err, syscall.EROFS) {
		t.Errorf("opening the write set for writing: %v, want EROFS", err)
	}
	if _, err := os.Stat(filepath.Join(root, MountDir, m2.Digest[len("sha256:"):], writeSetName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a base registered without a write set serves one: %v", err)
	}
}

// TestCheckPrivateDir checks which cache directories the fetcher, which runs
// as root, serves from: only those that nobody else could have written.
func TestCheckPrivateDir(t *testing.T) {
	for _, tc := range []struct {
		name    string
		make    func(path string) error
		wantErr string
	}{
		{"private directory", func(p string) error { return os.Mkdir(p, 0o700) }, ""},
		{"group-writable directory", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chmod(p, 0o770)
		}, "writable by group or others"},
		{"symbolic link to a private directory", func(p string) error {
			target := p + ".target"
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			return os.Symlink(target, p)
		}, "is not a directory"},
		{"regular file", func(p string) error { return os.WriteFile(p, nil, 0o600) }, "is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "entry")
			if err := tc.make(path); err != nil {
				t.Fatal(err)
			}
			err := checkPrivateDir(path)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("checkPrivateDir: %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("checkPrivateDir: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestServeRefusesOpenCacheEntry checks that a registered base whose cache
// directory others may write is not served.
func TestServeRefusesOpenCacheEntry(t *testing.T) {
	_, m, reg, root := registeredBase(t)
	hexRoot := m.Digest[len("sha256:"):]
	if err := os.Chmod(filepath.Join(root, CacheDir, hexRoot), 0o777); err != nil {
		t.Fatal(err)
	}
	serve(t, root, reg)
	if _, err := os.ReadFile(Path(root, hexRoot)); !errors.Is(err, syscall.EIO) {
		t.Errorf("reading a base whose cache entry anyone may write: %v, want EIO", err)
	}
	if n := len(reg.fetches); n != 0 {
		t.Errorf("%d blocks fetched for a refused entry", n)
	}
}

// TestFetchLogSurvivesATornLine checks that a fetch log whose last line was
// cut short (a fetcher stopped while writing it) still reads, and that the
// next fetcher's lines do not join the torn one.
func TestFetchLogSurvivesATornLine(t *testing.T) {
	root := t.TempDir()
	hex := strings.Repeat("ab", 32)
	path := FetchLogPath(root, hex)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{\"block\":1}\n{\"block\":2,\"by"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Fetches(root, hex); err != nil || len(got) != 1 || got[0].Block != 1 {
		t.Fatalf("Fetches of a log with a torn last line = %+v, %v; want block 1 alone", got, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := dropTornLine(f); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("{\"block\":3}\n")); err != nil {
		t.Fatal(err)
	}
	if got, err := Fetches(root, hex); err != nil || len(got) != 2 || got[1].Block != 3 {
		t.Errorf("Fetches after the torn line was dropped and a line appended = %+v, %v; want blocks 1 and 3", got, err)
	}
}

// TestServeWithAFullCache fetches a base into a node cache with room for
// one block: every read still returns the verified bytes, the blocks that
// did not fit are counted, and the cache file holds no part of them (a
// later load fetches them again rather than hash a torn block).
func TestServeWithAFullCache(t *testing.T) {
	data, m, reg := newBase(t)
	if os.Geteuid() != 0 {
		prereq.Missing(t, "mounting a small tmpfs for the node cache needs root")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=3m,mode=0755"); err != nil {
		t.Fatalf("mounting a 3 MiB tmpfs on %s: %v", root, err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	if err := Register(root, m, Source{Reference: "registry.test/base"}); err != nil {
		t.Fatal(err)
	}
	s := serve(t, root, reg)
	hexRoot := m.Digest[len("sha256:"):]
	got, err := os.ReadFile(Path(root, hexRoot))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("reading the whole base with a full cache: %v (equal: %t)", err, bytes.Equal(got, data))
	}
	// Four non-zero blocks (block 4 repeats block 1 but has its own
	// place in the cache file), 2 MiB each, in 3 MiB.
	if st := s.Stats(); st.CacheWriteFailures == 0 || st.Failures != 0 {
		t.Errorf("stats %+v: want cache write failures and no failed block", st)
	}
	cache, err := os.Open(filepath.Join(root, CacheDir, hexRoot, blocksName))
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	b := &base{cache: cache}
	kept := 0
	for i := range m.Blocks {
		off, n := m.Range(i)
		if m.Zero(i) || !b.cached(int64(off), int64(n)) {
			continue
		}
		kept++
		block := make([]byte, n)
		if _, err := cache.ReadAt(block, int64(off)); err != nil || !bytes.Equal(block, data[off:off+n]) {
			t.Errorf("block %d in the cache file: %v, or not the block", i, err)
		}
	}
	if kept >= 4 {
		t.Errorf("the 3 MiB cache holds %d of the 4 fetched blocks", kept)
	}
}

// TestServeBoundsFetchesInFlight reads 3*maxFetches distinct blocks at once
// from a registry that answers slowly: at most maxFetches fetches are in
// flight together, and every reader gets its bytes.
func TestServeBoundsFetchesInFlight(t *testing.T) {
	const blocks = 3 * maxFetches
	data := make([]byte, blocks*blockmanifest.BlockSize)
	for i := 0; i < blocks; i++ {
		copy(data[i*blockmanifest.BlockSize:], fmt.Sprintf("block %d", i))
	}
	m, reg := baseOf(t, data)
	root := t.TempDir()
	if err := Register(root, m, Source{Reference: "registry.test/base"}); err != nil {
		t.Fatal(err)
	}
	var inFlight, most atomic.Int32
	slow := func(ctx context.Context, dg string, size int64) ([]byte, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		return reg.fetch(ctx, dg, size)
	}
	if os.Geteuid() != 0 {
		prereq.Missing(t, "mounting the lazy fetcher's FUSE filesystem needs root")
	}
	s, err := Serve(root, func(Source) (FetchFunc, error) { return slow, nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unmount() })
	f, err := os.Open(Path(root, m.Digest[len("sha256:"):]))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	var bad atomic.Int32
	for i := 0; i < blocks; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			off := int64(i) * blockmanifest.BlockSize
			if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, data[off:off+4096]) {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Errorf("%d of %d readers got wrong bytes or an error", bad.Load(), blocks)
	}
	if got := most.Load(); got > maxFetches || got < 2 {
		t.Errorf("%d fetches in flight at most, want 2..%d", got, maxFetches)
	}
	t.Logf("%d fetches in flight at most for %d concurrent readers", most.Load(), blocks)
}

// registeredBaseWithID is registeredBase with the base's root in hex and as
// bytes (a write set's base ID).
func registeredBaseWithID(t *testing.T) (*blockmanifest.Manifest, *fakeRegistry, string, string, []byte) {
	t.Helper()
	_, m, reg, root := registeredBase(t)
	hexRoot := m.Digest[len("sha256:"):]
	id, err := hex.DecodeString(hexRoot)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg, root, hexRoot, id
}

// TestServeNoPrefetchAroundWriteSetBlocks checks that a miss of a block that
// the served write set touches (runsc asks for all of those at once) does
// not prefetch its neighbours, while a miss of any other block does.
func TestServeNoPrefetchAroundWriteSetBlocks(t *testing.T) {
	m, reg, root, hexRoot, id := registeredBaseWithID(t)
	const bs = blockmanifest.BlockSize
	ws := writeset.Encode(m.Length, id, [][2]uint64{{4*bs + 4096, 4*bs + 3*4096}})
	if ok, err := AddWriteSet(root, hexRoot, ws); !ok || err != nil {
		t.Fatalf("AddWriteSet = %v, %v", ok, err)
	}
	serve(t, root, reg)
	// runsc reads the write set before it reads the blocks it touches.
	if got, err := os.ReadFile(filepath.Join(root, MountDir, hexRoot, writeSetName)); err != nil || !bytes.Equal(got, ws) {
		t.Fatalf("reading the write set: %v", err)
	}
	f, err := os.Open(Path(root, hexRoot))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	// Block 4 is in the write set: block 5, its only non-zero neighbour,
	// must not be prefetched. Block 0 is not: block 1 must be.
	for _, off := range []int64{4*bs + 4096, 0} {
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatalf("reading at %#x: %v", off, err)
		}
	}
	var fetches []Fetch
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if fetches, err = Fetches(root, hexRoot); err != nil {
			t.Fatal(err)
		}
		if fetchesOf(fetches, 1) > 0 || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(100 * time.Millisecond) // a prefetch of block 5 would have started with block 4's miss
	if fetches, err = Fetches(root, hexRoot); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		block int
		want  int
	}{{0, 1}, {1, 1}, {4, 1}, {5, 0}} {
		if got := fetchesOf(fetches, tc.block); got != tc.want {
			t.Errorf("block %d fetched %d times, want %d (fetch log %v)", tc.block, got, tc.want, fetches)
		}
	}
}

func TestFetchWriteSetBlocks(t *testing.T) {
	m, reg, root, hexRoot, id := registeredBaseWithID(t)
	ctx := context.Background()
	// Before the fetcher serves the store: a clear error.
	if _, err := FetchWriteSetBlocks(ctx, root, m); err == nil || !strings.Contains(err.Error(), "is lazyd running") {
		t.Errorf("FetchWriteSetBlocks without a fetcher = %v, want an error asking whether lazyd runs", err)
	}
	serve(t, root, reg)
	// Without a write set: an error naming the file.
	if _, err := FetchWriteSetBlocks(ctx, root, m); err == nil || !strings.Contains(err.Error(), "base.writeset does not exist") {
		t.Errorf("FetchWriteSetBlocks without a write set = %v, want an error naming base.writeset", err)
	}
	// Ranges in block 0 (two ranges; block 1, not in the set, holds data
	// too: a neighbour prefetch or a read-ahead past block 0 would fetch
	// it), the zero block 2 (never fetched), 4, and the short last block 5.
	const bs = blockmanifest.BlockSize
	ws := writeset.Encode(m.Length, id, [][2]uint64{{0, 4096}, {8192, 3 * 4096}, {2 * bs, 2*bs + 4096}, {4*bs + 4096, 4*bs + 8192}, {5 * bs, 5*bs + 4096}})
	if ok, err := AddWriteSet(root, hexRoot, ws); !ok || err != nil {
		t.Fatalf("AddWriteSet = %v, %v", ok, err)
	}
	got, err := FetchWriteSetBlocks(ctx, root, m)
	if want := (WriteSetBlocks{Read: 3, Bytes: int64(2*bs + (m.Length - 5*bs))}); got != want || err != nil {
		t.Fatalf("FetchWriteSetBlocks = %+v, %v; want %+v, nil", got, err, want)
	}
	// Only those blocks were fetched (no neighbours, no read-ahead), once
	// each.
	fetches, err := Fetches(root, hexRoot)
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.Blocks {
		want := 0
		if i == 0 || i == 4 || i == 5 {
			want = 1
		}
		if got := fetchesOf(fetches, i); got != want {
			t.Errorf("block %d fetched %d times, want %d (fetch log %v)", i, got, want, fetches)
		}
	}
}

func TestFetchWriteSetBlocksFailsWithTheRegistry(t *testing.T) {
	m, reg, root, hexRoot, id := registeredBaseWithID(t)
	serve(t, root, reg)
	if ok, err := AddWriteSet(root, hexRoot, writeset.Encode(m.Length, id, [][2]uint64{{4 * blockmanifest.BlockSize, 4*blockmanifest.BlockSize + 4096}})); !ok || err != nil {
		t.Fatalf("AddWriteSet = %v, %v", ok, err)
	}
	reg.setDown(true)
	if got, err := FetchWriteSetBlocks(context.Background(), root, m); err == nil || !strings.Contains(err.Error(), "reading block 4") {
		t.Errorf("FetchWriteSetBlocks with the registry down = %+v, %v; want an error naming block 4", got, err)
	}
}

func TestFetchWriteSetBlocksRefusesAnotherBasesSet(t *testing.T) {
	_, m, reg, root := registeredBase(t)
	hexRoot := m.Digest[len("sha256:"):]
	serve(t, root, reg)
	if ok, err := AddWriteSet(root, hexRoot, writeset.Encode(m.Length, make([]byte, 32), [][2]uint64{{0, 4096}})); !ok || err != nil {
		t.Fatalf("AddWriteSet = %v, %v", ok, err)
	}
	if _, err := FetchWriteSetBlocks(context.Background(), root, m); err == nil || !strings.Contains(err.Error(), "not for base") {
		t.Errorf("FetchWriteSetBlocks of another base's set = %v, want an error saying it is not for this base", err)
	}
	if fs, _ := Fetches(root, hexRoot); len(fs) != 0 {
		t.Errorf("%d blocks fetched for a set that is not this base's", len(fs))
	}
}
