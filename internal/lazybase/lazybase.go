// Package lazybase serves shared bases that a node has not fetched yet.
//
// A base pulled lazily (`forkvisor-oci pull --lazy`) is registered in the
// node base store: its block manifest (package blockmanifest) and where its
// blocks are (an OCI repository). The node's fetcher (`forkvisor-oci lazyd`,
// one per node) serves every registered base as a read-only file of a FUSE
// filesystem mounted in the store:
//
//	STORE/lazy/<hex>/base.img       the base, as runsc restore maps it
//	STORE/lazy/<hex>/base.json      its publish record (runsc's base.json)
//	STORE/lazy/<hex>/base.writeset  its write set, if the pull brought one
//	STORE/lazy-cache/<hex>/         manifest.json, source.json, blocks,
//	                                fetches.jsonl, base.writeset
//
// A lazy node cannot learn a base's write set (the pages that its clones
// write right after a restore, which runsc copies in bulk while the sandbox
// starts): base.img is read-only here. A checkpoint pulled from a node that
// had learned one carries it (AddWriteSet), and runsc applies it after
// checking it against the base; the fetcher serves the first one recorded,
// also when it arrives after the fetcher started serving the base. The pull
// then has the fetcher fetch the set's blocks (FetchWriteSetBlocks), since
// every restore copies them first, and the fetcher prefetches no
// neighbours around them (prefetchRange).
//
// A read of base.img first makes sure that every 2 MiB block it overlaps is
// present in the node's cache file (blocks): a block that is not is fetched
// from the registry, its SHA-256 compared with the block manifest, written
// to the cache file, and only then are its bytes returned. Known-zero blocks
// are never fetched. A block is fetched once per node however many readers
// ask for it at once (one fetch per block in flight, the others wait for
// it), and a block found in the cache file (after the fetcher restarts, or
// once the page cache dropped it) is hashed again before it is trusted; the
// last few blocks verified stay in memory for the rest of their reads
// (recentBlocks). A block that cannot be fetched or does
// not match fails the read with EIO and a log line naming the block, the
// base and the reference; its bytes never reach a reader.
//
// Why FUSE rather than a protocol of the sandbox's own: every clone maps the
// same file, so the kernel's page cache of that one inode holds each base
// page once for the node (userfaultfd would install private pages per
// process and lose the sharing), and every path by which a sentry reads base
// memory (its own mapping, systrap stubs' mappings, pread, sendfile) goes
// through that page cache, so none of them can bypass the fetch and its
// check. The sentry needs no network access and no change: runsc hands it a
// descriptor of base.img like any other base.
//
// Invariants: a page of base.img is in the page cache only if a read
// returned it, and a read returns only bytes of blocks whose SHA-256 matched
// the manifest, which commits to the root that the checkpoint records (the
// manifest is validated against its root when it is registered and again
// when it is loaded). The attributes of base.img never change, and files are
// opened with FOPEN_KEEP_CACHE, so the kernel never drops the cache because
// another sandbox opened the file.
package lazybase

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/noreplace"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// Names in the base store.
const (
	// MountDir is the FUSE mount point under the store root.
	MountDir = "lazy"
	// CacheDir holds the registered bases' state under the store root.
	CacheDir = "lazy-cache"
	// FSType is the mount's type as /proc/self/mountinfo shows it; runsc
	// maps a base from a FUSE mount only if it has this type and was
	// mounted by root.
	FSType = "fuse.forkvisor-lazy"

	manifestName = "manifest.json"
	sourceName   = "source.json"
	blocksName   = "blocks"
	fetchLogName = "fetches.jsonl"
	baseName     = "base.img"
	recordName   = "base.json"
	writeSetName = "base.writeset"

	// maxWriteSetBytes bounds a write set that the fetcher serves.
	maxWriteSetBytes = 16 << 20
)

// Source says where the blocks of a base are.
type Source struct {
	// Reference is the OCI repository ("host[:port]/name"), with or without
	// a tag; blocks are fetched by digest.
	Reference string `json:"reference"`
	// PlainHTTP talks HTTP instead of HTTPS to the registry.
	PlainHTTP bool `json:"plain_http,omitempty"`
}

// ErrMismatch may be wrapped by a FetchFunc's error when the FetchFunc
// checks digests itself and the registry served other content than the
// digest names. The fetcher compares every block with the block manifest
// whatever the FetchFunc checked.
var ErrMismatch = errors.New("content does not match its digest")

// FetchFunc fetches the blob with digest ("sha256:<hex>") and size.
type FetchFunc func(ctx context.Context, digest string, size int64) ([]byte, error)

// NewFetcherFunc returns the FetchFunc for a Source.
type NewFetcherFunc func(Source) (FetchFunc, error)

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Path returns where the fetcher serves base hex of the store at root.
func Path(root, hex string) string {
	return filepath.Join(root, MountDir, hex, baseName)
}

// Register records base m (validated against its root) and its source in the
// store at root, so that a running fetcher serves it. It replaces nothing
// that is registered already: a base is content-addressed, so the first
// registration stands (its source is where its blocks were first found).
func Register(root string, m *blockmanifest.Manifest, src Source) error {
	if err := m.Validate(); err != nil {
		return err
	}
	hex, ok := bytes.CutPrefix([]byte(m.Digest), []byte("sha256:"))
	if !ok || !hexDigest.Match(hex) {
		return fmt.Errorf("block manifest root %q is not a sha256 digest", m.Digest)
	}
	if src.Reference == "" {
		return errors.New("registering a lazy base: no registry reference")
	}
	dir := filepath.Join(root, CacheDir, string(hex))
	if _, err := os.Stat(filepath.Join(dir, sourceName)); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(root, CacheDir), 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Join(root, CacheDir), ".register-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	s, _ := json.Marshal(src)
	// source.json is written last: its presence marks a complete entry.
	for _, f := range []struct {
		name string
		data []byte
	}{{manifestName, m.Encode()}, {sourceName, s}} {
		if _, err := noreplace.WriteFile(filepath.Join(tmp, f.name), f.data, 0o600); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, sourceName)); serr == nil {
			return nil // Registered concurrently.
		}
		return fmt.Errorf("registering lazy base %s in %s: %w", m.Digest, root, err)
	}
	return nil
}

// AddWriteSet records data as the write set of the registered base hex
// (runsc's base.writeset) unless it has one; it says whether it recorded
// it. runsc checks a write set against its base before applying it, so
// data is not decoded here.
func AddWriteSet(root, hex string, data []byte) (bool, error) {
	if !hexDigest.MatchString(hex) {
		return false, fmt.Errorf("%q is not a sha256 hex digest", hex)
	}
	if len(data) == 0 || len(data) > maxWriteSetBytes {
		return false, fmt.Errorf("write set of base sha256:%s: %d bytes, want 1 to %d", hex, len(data), maxWriteSetBytes)
	}
	dir := filepath.Join(root, CacheDir, hex)
	if _, err := os.Stat(filepath.Join(dir, sourceName)); err != nil {
		return false, fmt.Errorf("write set of base sha256:%s: the base is not registered: %w", hex, err)
	}
	created, err := noreplace.WriteFile(filepath.Join(dir, writeSetName), data, 0o600)
	if err != nil {
		return false, fmt.Errorf("write set of base sha256:%s: %w", hex, err)
	}
	return created, nil
}

// Stats counts what a Server did.
type Stats struct {
	BlocksFetched int64 `json:"blocks_fetched"`
	BytesFetched  int64 `json:"bytes_fetched"`
	// BlocksVerifiedLocal counts blocks found in the cache file (fetched
	// before the fetcher restarted) and hashed again.
	BlocksVerifiedLocal int64 `json:"blocks_verified_local"`
	// Failures counts blocks that could not be fetched or did not match.
	Failures int64 `json:"failures"`
	// BlocksFromMemory counts loads served from the blocks kept in memory
	// (recentBlocks): the rest of a block that the kernel reads in several
	// requests.
	BlocksFromMemory int64 `json:"blocks_from_memory"`
	// CacheWriteFailures counts fetched, verified blocks that could not be
	// written to the cache file (a full disk): they were served from
	// memory and are fetched again once evicted there.
	CacheWriteFailures int64 `json:"cache_write_failures"`
}

// Server is a running fetcher.
type Server struct {
	root       string
	newFetcher NewFetcherFunc
	fuse       *fuse.Server

	// recent holds the blocks most recently verified, of every base.
	recent *recentBlocks

	// fetchSlots holds a token for each registry fetch in flight, of
	// every base: at most maxFetches.
	fetchSlots chan struct{}

	mu    sync.Mutex
	bases map[string]*base // by hex digest; protected by mu
	stats Stats            // protected by mu
}

// recentBlocks keeps the last recentCapacity blocks that a Server fetched
// or read back from its cache file, verified, least recently used first
// out. The kernel reads a block in several requests (1 MiB at most per
// FUSE read), and the cache file's copy of a block leaves the page cache
// once written back (load): without this, every request after the first
// would read the block back from disk and hash it again, which doubled the
// cost of a first touch.
//
// Invariant: an entry's bytes matched the block manifest when they were
// added, and are never written to afterwards (readers copy out of them).
type recentBlocks = lru.Cache[recentKey, []byte]

// recentKey names block i of base hex.
type recentKey struct {
	hex string
	i   int
}

// recentCapacity bounds recentBlocks: 32 MiB.
const recentCapacity = 16

func newRecentBlocks() *recentBlocks {
	c, err := lru.New[recentKey, []byte](recentCapacity)
	if err != nil {
		panic(err) // only for a size <= 0
	}
	return c
}

// Serve mounts the fetcher's filesystem at root/lazy (creating it) and
// serves it until Unmount. It needs root (a direct mount with allow_other,
// so that sandboxes of any user can read it).
func Serve(root string, newFetcher NewFetcherFunc) (*Server, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	// Bases are guest memory: only root may read them (runsc opens them as
	// root and hands the sandbox a descriptor).
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, err
	}
	mnt := filepath.Join(root, MountDir)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		if !errors.Is(err, syscall.ENOTCONN) {
			return nil, err
		}
	}
	// A fetcher that died leaves its mount behind, which then fails every
	// access with ENOTCONN: clear that one, and never a live fetcher's.
	if _, err := os.Stat(mnt); errors.Is(err, syscall.ENOTCONN) {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	} else if mounted(mnt) {
		return nil, fmt.Errorf("a lazy base fetcher already serves %s", mnt)
	}
	s := &Server{root: root, newFetcher: newFetcher, recent: newRecentBlocks(), fetchSlots: make(chan struct{}, maxFetches), bases: map[string]*base{}}
	long := time.Hour
	srv, err := fs.Mount(mnt, &rootNode{s: s}, &fs.Options{
		MountOptions: fuse.MountOptions{
			// Sandboxes of any user read through runsc's descriptor;
			// opening is left to the kernel's check of the modes below
			// (root only).
			AllowOther:  true,
			Options:     []string{"default_permissions"},
			DirectMount: true,
			FsName:      "forkvisor-lazy",
			Name:        "forkvisor-lazy",
			// Reads of up to 1 MiB per request. ReadResultData is not
			// spliced (a pipe holds 1 MiB, not a reply of 1 MiB plus
			// its header).
			MaxWrite:      1 << 20,
			DisableSplice: true,
			// Asynchronous reads in flight before a reader blocks in
			// the kernel (12 by default): runsc advises (FADV_WILLNEED)
			// every block of a write set at once, and the fetcher
			// fetches them in parallel.
			MaxBackground: 128,
		},
		EntryTimeout:    &long,
		AttrTimeout:     &long,
		NegativeTimeout: new(time.Duration),
		UID:             0,
		GID:             0,
	})
	if err != nil {
		return nil, fmt.Errorf("mounting the lazy base fetcher at %s: %w", mnt, err)
	}
	s.fuse = srv
	raiseReadahead(mnt)
	return s, nil
}

// raiseReadahead lets the kernel read ahead a whole block per request on the
// mount (its default is 128 KiB); errors are ignored.
func raiseReadahead(mnt string) {
	var st unix.Stat_t
	if unix.Stat(mnt, &st) != nil {
		return
	}
	path := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	_ = os.WriteFile(path, []byte(strconv.Itoa(blockmanifest.BlockSize>>10)), 0)
}

// Wait waits until the filesystem is unmounted.
func (s *Server) Wait() { s.fuse.Wait() }

// Unmount unmounts the filesystem. It fails (EBUSY) while sandboxes map a
// base; once it is gone, any read of a base page that is not in the page
// cache fails (SIGBUS in the guest), including pages read before and since
// evicted.
func (s *Server) Unmount() error {
	return s.fuse.Unmount()
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// base is one registered base being served.
type base struct {
	s     *Server
	hex   string
	m     *blockmanifest.Manifest
	src   Source
	fetch FetchFunc
	// cache is the node's copy of the base's verified blocks (a sparse
	// file of the base's length).
	cache  *os.File
	record []byte // the publish record served as base.json

	group singleflight.Group

	// prefetching holds a token per prefetch in flight (maxPrefetches).
	prefetching chan struct{}

	mu sync.Mutex
	// present[i] is true once block i was loaded (verified) at least
	// once; it steers prefetching and the statistics, never what is
	// served. Protected by mu.
	present []bool
	logFile *os.File
	// failed holds the last failure of blocks whose last load failed;
	// protected by mu.
	failed map[int]failure
	// advised[i] is true for the blocks that the served write set touches.
	// runsc asks for all of them at once while it starts a restore
	// (FADV_WILLNEED on each, see runsc/sharedbase), so a miss of one of
	// them says nothing about where a reader goes next: its neighbours are
	// not prefetched, which keeps the fetch work at the start of a restore
	// to the blocks it needs. nil until a valid write set is served (an
	// invalid one is served too, since runsc checks and logs it, but
	// advises nothing). Protected by mu.
	advised []bool
}

// loadBase returns the served state of base hex, loading it on first use.
func (s *Server) loadBase(hex string) (*base, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.bases[hex]; ok {
		return b, nil
	}
	dir := filepath.Join(s.root, CacheDir, hex)
	// Root serves what the entry says, from where it says, into the file it
	// names: only an entry that nobody else could have written is used.
	for _, d := range []string{filepath.Join(s.root, CacheDir), dir} {
		if err := checkPrivateDir(d); err != nil {
			return nil, err
		}
	}
	srcData, err := os.ReadFile(filepath.Join(dir, sourceName))
	if err != nil {
		return nil, err
	}
	var src Source
	if err := json.Unmarshal(srcData, &src); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, sourceName), err)
	}
	mData, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, err
	}
	m, err := blockmanifest.Decode(mData)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, manifestName), err)
	}
	if m.Digest != "sha256:"+hex {
		return nil, fmt.Errorf("%s is the manifest of base %s, not sha256:%s", filepath.Join(dir, manifestName), m.Digest, hex)
	}
	fetch, err := s.newFetcher(src)
	if err != nil {
		return nil, fmt.Errorf("base sha256:%s: registry %s: %w", hex, src.Reference, err)
	}
	cache, err := os.OpenFile(filepath.Join(dir, blocksName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := cache.Truncate(int64(m.Length)); err != nil {
		cache.Close()
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, fetchLogName), os.O_RDWR|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		cache.Close()
		return nil, err
	}
	if err := dropTornLine(logFile); err != nil {
		cache.Close()
		logFile.Close()
		return nil, fmt.Errorf("%s: %w", logFile.Name(), err)
	}
	record, _ := json.Marshal(map[string]any{"version": 1, "length": m.Length, "sha256": hex, "image": baseName})
	b := &base{s: s, hex: hex, m: m, src: src, fetch: fetch, cache: cache, record: record, present: make([]bool, len(m.Blocks)), logFile: logFile, failed: map[int]failure{}, prefetching: make(chan struct{}, maxPrefetches)}
	s.bases[hex] = b
	return b, nil
}

// dropTornLine truncates f, a log of newline-terminated lines, after its
// last newline: a fetcher that stopped while writing a line leaves it cut
// short, and the next line appended would join it.
func dropTornLine(f *os.File) error {
	data, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<62))
	if err != nil {
		return err
	}
	if n := bytes.LastIndexByte(data, '\n') + 1; n != len(data) {
		return f.Truncate(int64(n))
	}
	return nil
}

// checkPrivateDir returns an error unless path is a directory (not a
// symbolic link) owned by root or by this process's user, which no group or
// other user may write: Register creates every cache directory so (mode
// 0700).
func checkPrivateDir(path string) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory (%v): not serving from it", path, st.Mode().Type())
	case !ok || (sys.Uid != 0 && int(sys.Uid) != os.Geteuid()):
		return fmt.Errorf("%s is owned by another user: not serving from it", path)
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by group or others (mode %v): not serving from it", path, st.Mode().Perm())
	}
	return nil
}

// readWriteSet returns the write set at path, nil if there is none.
func readWriteSet(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxWriteSetBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) == 0 || len(data) > maxWriteSetBytes {
		return nil, fmt.Errorf("%s: %d bytes, want 1 to %d", path, len(data), maxWriteSetBytes)
	}
	return data, nil
}

// noteWriteSet records which blocks the write set data touches (advised),
// if it is a valid write set of b; the first one noted stays, like the
// first one served.
func (b *base) noteWriteSet(data []byte) {
	id, err := hex.DecodeString(b.hex)
	if err != nil {
		return
	}
	ranges, err := writeset.Ranges(data, b.m.Length, id)
	if err != nil {
		return // served all the same; runsc refuses it with the reason
	}
	advised := make([]bool, len(b.m.Blocks))
	for _, i := range writeset.Blocks(ranges, blockmanifest.BlockSize) {
		advised[i] = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.advised == nil {
		b.advised = advised
	}
}

// readAt fills dest with the base's bytes at off, making sure first that
// every block it overlaps is present and verified.
func (b *base) readAt(dest []byte, off int64) (int, error) {
	if off >= int64(b.m.Length) {
		return 0, nil
	}
	n := min(int64(len(dest)), int64(b.m.Length)-off)
	dest = dest[:n]
	for done := int64(0); done < n; {
		i := int((off + done) / blockmanifest.BlockSize)
		bOff, bLen := b.m.Range(i)
		from := off + done - int64(bOff)
		part := min(int64(bLen)-from, n-done)
		dst := dest[done : done+part]
		if b.m.Zero(i) {
			clear(dst)
		} else {
			block, fetched, err := b.ensure(i)
			if err != nil {
				return 0, err
			}
			if fetched {
				b.prefetchAfter(i)
			}
			copy(dst, block[from:])
		}
		done += part
	}
	return int(n), nil
}

// prefetchAfter starts fetching, in the background, the blocks that a reader
// that just missed block i is likely to touch next (prefetchRange).
// Neighbours are fetched concurrently with the reader's own accesses, so a
// jump costs about one registry round trip instead of one per block.
// Readers of those blocks wait for the fetch in flight rather than start
// another.
func (b *base) prefetchAfter(i int) {
	b.mu.Lock()
	from, to := prefetchRange(i, len(b.present), func(j int) bool { return b.present[j] }, func(j int) bool { return b.advised != nil && b.advised[j] })
	b.mu.Unlock()
	for j := max(from, 0); j <= to && j < len(b.m.Blocks); j++ {
		if j == i || b.m.Zero(j) {
			continue
		}
		b.mu.Lock()
		present := b.present[j]
		b.mu.Unlock()
		if present {
			continue
		}
		select {
		case b.prefetching <- struct{}{}:
		default:
			return // enough in flight; readers fetch the rest themselves
		}
		select {
		case b.s.fetchSlots <- struct{}{}:
		default:
			<-b.prefetching
			return // every fetch slot of the node is taken: readers first
		}
		go func() {
			defer func() {
				<-b.s.fetchSlots
				<-b.prefetching
			}()
			b.load1(j, true)
		}()
	}
}

// prefetchRange returns the blocks [from, to] (to be clipped to [0, n)) to
// prefetch after a miss of block i of n, given which blocks are present:
// for a reader that seems to go up through the base (block i-1 is
// present), the prefetchBlocks blocks after i (after i+1 too, when i filled
// a gap); for one that goes down (i+1 present, i-1 not: a restored guest
// touches its stacks and the top of its heap from high addresses down), the
// prefetchBlocks blocks before i; else, having jumped to block i, its two
// neighbours (stacks, heap arenas and text span adjacent blocks, and are
// touched out of order). Nothing (from > to) after a miss of a block of the
// served write set (advised): runsc asks for all of those at once, so such a
// miss says nothing about where a reader goes next. Blocks in the range
// that are present are skipped by the caller.
func prefetchRange(i, n int, present, advised func(int) bool) (from, to int) {
	if advised(i) {
		return i + 1, i
	}
	below := i > 0 && present(i-1)
	above := i+1 < n && present(i+1)
	switch {
	case below && above:
		return i + 2, i + 1 + prefetchBlocks
	case below:
		return i + 1, i + prefetchBlocks
	case above:
		return i - prefetchBlocks, i - 1
	default:
		return i - 1, i + 1
	}
}

// prefetchBlocks is how far ahead of a sequential reader blocks are
// fetched, in the direction it goes.
const prefetchBlocks = 2

// maxPrefetches bounds the prefetches in flight per base: a reader that
// jumps around must not start a registry request for every neighbour it
// passes.
const maxPrefetches = 4

// ensure returns block i as load1 does for a reader.
func (b *base) ensure(i int) ([]byte, bool, error) {
	return b.load1(i, false)
}

// load1 returns block i, verified, and whether it was fetched from the
// registry for this call (rather than found in the node cache). Concurrent
// callers for one block share one load. A block whose load failed less
// than FailureBackoff ago fails again at once, without another attempt: a
// reader retries a failed access (the kernel reads a failed readahead again
// page by page), and a registry that hangs must not hold every retry for
// fetchTimeout. A failed speculative load (a prefetch, which no reader
// asked for) is not remembered that way: the reader that touches the block
// later tries again. A speculative caller holds one of the node's fetch
// slots (prefetchAfter).
func (b *base) load1(i int, speculative bool) ([]byte, bool, error) {
	type loaded struct {
		block   []byte
		fetched bool
	}
	v, err, _ := b.group.Do(strconv.Itoa(i), func() (any, error) {
		b.mu.Lock()
		f, failed := b.failed[i]
		b.mu.Unlock()
		if failed && time.Since(f.at) < FailureBackoff {
			return nil, f.err
		}
		block, fetched, err := b.load(i, speculative)
		b.mu.Lock()
		defer b.mu.Unlock()
		if err != nil && speculative {
			fmt.Fprintf(os.Stderr, "lazybase: prefetch: %v\n", err)
			return nil, err
		}
		if err != nil {
			b.failed[i] = failure{at: time.Now(), err: err}
			b.s.mu.Lock()
			b.s.stats.Failures++
			b.s.mu.Unlock()
			fmt.Fprintf(os.Stderr, "lazybase: %v\n", err)
			return nil, err
		}
		delete(b.failed, i)
		b.present[i] = true
		return loaded{block, fetched}, nil
	})
	if err != nil {
		return nil, false, err
	}
	l := v.(loaded)
	return l.block, l.fetched, nil
}

// failure is a failed load of a block.
type failure struct {
	at  time.Time
	err error
}

// FailureBackoff is how long a failed block fails again without a new
// attempt.
const FailureBackoff = 2 * time.Second

// load returns block i, verified: from the cache file if it holds it (a
// fetcher that restarted), else fetched from the registry and written to the
// cache file.
//
// A block is hashed whenever it is read from the cache file, not only the
// first time: the file is written back in the background, and a block that
// the disk lost or damaged since must be fetched again, not served.
func (b *base) load(i int, speculative bool) ([]byte, bool, error) {
	off, n := b.m.Range(i)
	want := b.m.Blocks[i]
	key := recentKey{b.hex, i}
	if block, ok := b.s.recent.Get(key); ok {
		b.s.mu.Lock()
		b.s.stats.BlocksFromMemory++
		b.s.mu.Unlock()
		return block, false, nil
	}
	if b.cached(int64(off), int64(n)) {
		block := make([]byte, n)
		if _, err := b.cache.ReadAt(block, int64(off)); err == nil && sumOf(block) == want {
			b.s.recent.Add(key, block)
			b.mu.Lock()
			known := b.present[i]
			b.mu.Unlock()
			if !known {
				b.s.mu.Lock()
				b.s.stats.BlocksVerifiedLocal++
				b.s.mu.Unlock()
			}
			return block, false, nil
		}
	}
	start := time.Now()
	data, err := b.s.fetchBounded(b.fetch, want, int64(n), speculative)
	if errors.Is(err, ErrMismatch) {
		return nil, false, fmt.Errorf("block %d of base sha256:%s from %s does not match the block manifest (%s): %w; refused", i, b.hex, b.src.Reference, want, err)
	}
	if err != nil {
		return nil, false, fmt.Errorf("block %d (%s) of base sha256:%s from %s: %w", i, want, b.hex, b.src.Reference, err)
	}
	if got := sumOf(data); uint64(len(data)) != n || got != want {
		return nil, false, fmt.Errorf("block %d of base sha256:%s from %s does not match the block manifest (%d bytes with %s): %d bytes with digest %s; refused", i, b.hex, b.src.Reference, n, want, len(data), got)
	}
	b.s.recent.Add(key, data)
	if _, err := b.cache.WriteAt(data, int64(off)); err != nil {
		// The block is verified: serve it from memory (recent) and fetch
		// it again once it is evicted there. A full or failing cache disk
		// makes the node fetch more, never a verified read fail. The hole
		// makes cached skip the block's range; should punching fail too,
		// a partial write is still never served: a block read from the
		// cache file is hashed first.
		_ = unix.Fallocate(int(b.cache.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(n))
		fmt.Fprintf(os.Stderr, "lazybase: serving block %d of base sha256:%s from memory: writing it to the node cache %s: %v\n", i, b.hex, b.cache.Name(), err)
		b.s.mu.Lock()
		b.s.stats.CacheWriteFailures++
		b.s.mu.Unlock()
	} else {
		// The sandboxes read the block through the FUSE file's page
		// cache; do not keep a second copy in the cache file's once it is
		// written back. The readers do not wait for that: the page cache
		// serves the block until then.
		go func() {
			fd := int(b.cache.Fd())
			_ = unix.SyncFileRange(fd, int64(off), int64(n), unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
			_ = unix.Fadvise(fd, int64(off), int64(n), unix.FADV_DONTNEED)
		}()
	}
	b.s.mu.Lock()
	b.s.stats.BlocksFetched++
	b.s.stats.BytesFetched += int64(n)
	b.s.mu.Unlock()
	line, _ := json.Marshal(Fetch{Block: i, Digest: want, Bytes: int64(n), Ms: time.Since(start).Milliseconds(), StartUnixMicro: start.UnixMicro(), Prefetch: speculative, Reference: b.src.Reference})
	b.mu.Lock()
	b.logFile.Write(append(line, '\n'))
	b.mu.Unlock()
	return data, true, nil
}

// cached returns whether the node cache file may hold data in [off,
// off+n): false only when the range is a hole, which a block never written
// to the cache is (reading and hashing its zeros would only delay the
// fetch). Moving the file offset is harmless: the cache file is only read
// and written at explicit offsets.
func (b *base) cached(off, n int64) bool {
	data, err := unix.Seek(int(b.cache.Fd()), off, unix.SEEK_DATA)
	if err == unix.ENXIO {
		return false // no data from off to the end of the file
	}
	return err != nil || data < off+n
}

// maxFetches bounds the registry fetches in flight on a node, for every
// base and reader together: a fetch holds a block (2 MiB) in memory, and
// the kernel may send up to MaxBackground (128) reads at once, each for a
// different block. Readers beyond it wait for a slot (within fetchTimeout).
const maxFetches = 8

// fetchBounded calls fetch with fetchTimeout, holding one of s.fetchSlots:
// the caller's if holdsSlot (a prefetch takes its slot before it starts, in
// prefetchAfter, and is skipped if none is free, so that prefetches never
// hold up readers), else one it waits for, for at most fetchTimeout.
func (s *Server) fetchBounded(fetch FetchFunc, digest string, size int64, holdsSlot bool) ([]byte, error) {
	if !holdsSlot {
		wait := time.NewTimer(fetchTimeout)
		defer wait.Stop()
		select {
		case s.fetchSlots <- struct{}{}:
		case <-wait.C:
			return nil, fmt.Errorf("no fetch finished among the node's %d registry fetches in flight within %s", maxFetches, fetchTimeout)
		}
		defer func() { <-s.fetchSlots }()
	}
	// The fetch outlives the read that started it (others may wait on it),
	// but not a registry that stopped answering.
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	return fetch(ctx, digest, size)
}

// fetchTimeout bounds one block fetch.
const fetchTimeout = 60 * time.Second

func sumOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// rootNode is the mount's root: one directory per registered base.
type rootNode struct {
	fs.Inode
	s *Server
}

var _ = (fs.NodeLookuper)((*rootNode)(nil))
var _ = (fs.NodeGetattrer)((*rootNode)(nil))

func (r *rootNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFDIR | 0o500
	return 0
}

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if !hexDigest.MatchString(name) {
		return nil, syscall.ENOENT
	}
	b, err := r.s.loadBase(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, syscall.ENOENT
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lazybase: %v\n", err)
		return nil, syscall.EIO
	}
	if ch := r.GetChild(name); ch != nil {
		return ch, 0
	}
	dir := r.NewPersistentInode(ctx, &dirNode{b: b, writeSetPath: filepath.Join(r.s.root, CacheDir, name, writeSetName)}, fs.StableAttr{Mode: fuse.S_IFDIR})
	dir.AddChild(baseName, dir.NewPersistentInode(ctx, &fileNode{b: b}, fs.StableAttr{Mode: fuse.S_IFREG}), false)
	dir.AddChild(recordName, dir.NewPersistentInode(ctx, &recordNode{data: b.record}, fs.StableAttr{Mode: fuse.S_IFREG}), false)
	r.AddChild(name, dir, false)
	out.Mode = fuse.S_IFDIR | 0o500
	return dir, 0
}

// dirNode is the directory of one base: base.img and base.json from the
// start, base.writeset from the first lookup after AddWriteSet recorded it
// (a write set may arrive with a later pull of the same base). The kernel
// does not cache a failed lookup (no negative timeout), so it asks again.
type dirNode struct {
	fs.Inode
	b            *base
	writeSetPath string
}

var _ = (fs.NodeGetattrer)((*dirNode)(nil))
var _ = (fs.NodeLookuper)((*dirNode)(nil))

func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch := d.GetChild(name)
	if ch == nil && name == writeSetName {
		data, err := readWriteSet(d.writeSetPath)
		if err != nil {
			// Served without it: runsc then restores without a write set.
			fmt.Fprintf(os.Stderr, "lazybase: not serving %s: %v\n", d.writeSetPath, err)
		}
		if data != nil {
			d.b.noteWriteSet(data)
			d.AddChild(name, d.NewPersistentInode(ctx, &recordNode{data: data}, fs.StableAttr{Mode: fuse.S_IFREG}), false)
			ch = d.GetChild(name) // this one, or one added concurrently
		}
	}
	if ch == nil {
		return nil, syscall.ENOENT
	}
	if ga, ok := ch.Operations().(fs.NodeGetattrer); ok {
		var a fuse.AttrOut
		if errno := ga.Getattr(ctx, nil, &a); errno != 0 {
			return nil, errno
		}
		out.Attr = a.Attr
	}
	return ch, 0
}

func (d *dirNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFDIR | 0o500
	return 0
}

// fileNode is base.img of one base.
type fileNode struct {
	fs.Inode
	b *base
}

var _ = (fs.NodeGetattrer)((*fileNode)(nil))
var _ = (fs.NodeOpener)((*fileNode)(nil))
var _ = (fs.NodeReader)((*fileNode)(nil))

func (n *fileNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFREG | 0o400
	out.Size = n.b.m.Length
	out.Blocks = (n.b.m.Length + 511) / 512
	out.Blksize = 4096
	return 0
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return openReadOnly(flags)
}

// openReadOnly opens a file of the mount: read-only, and with the page cache
// kept across opens (the content never changes).
func openReadOnly(flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

func (n *fileNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	got, err := n.b.readAt(dest, off)
	if err != nil {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

// recordNode is base.json or base.writeset of one base: a read-only file of
// fixed content.
type recordNode struct {
	fs.Inode
	data []byte
}

var _ = (fs.NodeGetattrer)((*recordNode)(nil))
var _ = (fs.NodeOpener)((*recordNode)(nil))
var _ = (fs.NodeReader)((*recordNode)(nil))

func (n *recordNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFREG | 0o400
	out.Size = uint64(len(n.data))
	return 0
}

func (n *recordNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return openReadOnly(flags)
}

func (n *recordNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(n.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(n.data[off:min(int64(len(n.data)), off+int64(len(dest)))]), 0
}
