package lazybase

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// maxWriteSetReads bounds the blocks that FetchWriteSetBlocks reads at once;
// the fetcher bounds the node's registry fetches on its own (maxFetches).
const maxWriteSetReads = 4

// MaxWriteSetBlocks bounds the blocks that FetchWriteSetBlocks reads (64
// MiB): a dense writer's set may cover its whole base, and a pull must not
// turn into a whole fetch of it. Blocks past it are fetched when a restore
// copies them, as without FetchWriteSetBlocks.
const MaxWriteSetBlocks = 32

// WriteSetBlocks is what FetchWriteSetBlocks did.
type WriteSetBlocks struct {
	// Read counts the blocks read through the fetcher (fetched from the
	// registry, or found verified in the node's cache) and Bytes their
	// size; zero blocks, which the fetcher never fetches, are not read.
	Read  int
	Bytes int64
	// Left counts the non-zero blocks of the set beyond MaxWriteSetBlocks.
	Left int
}

// FetchWriteSetBlocks reads, through the running fetcher's mount in the
// store at root, the non-zero blocks of the base with block manifest m (as
// registered) that the write set served beside it touches (the first
// MaxWriteSetBlocks of them).
//
// Every restore of a base copies its write set's pages first, while runsc
// starts the sandbox; on a lazy node the fetcher would fetch and hash those
// blocks at that moment, on the CPUs that the sandbox's start needs. A pull
// that brought a write set calls this instead, so that the blocks are
// verified and in the node's cache (and its page cache) before any restore.
// What is read goes through the fetcher like any read: verified, fetched
// once per node. It fails if the fetcher does not serve the base or its
// write set, or a block cannot be read; the pull reports that and goes on
// (a restore then fetches the blocks itself).
func FetchWriteSetBlocks(ctx context.Context, root string, m *blockmanifest.Manifest) (WriteSetBlocks, error) {
	var res WriteSetBlocks
	hexRoot := strings.TrimPrefix(m.Digest, "sha256:")
	if !hexDigest.MatchString(hexRoot) {
		return res, fmt.Errorf("%q is not a sha256 digest", m.Digest)
	}
	id, _ := hex.DecodeString(hexRoot)
	f, err := os.Open(Path(root, hexRoot))
	if errors.Is(err, os.ErrNotExist) {
		return res, fmt.Errorf("the lazy fetcher does not serve the base (is lazyd running on %s?): %w", filepath.Join(root, MountDir), err)
	}
	if err != nil {
		return res, err
	}
	defer f.Close()
	// Read exactly the blocks asked for: without this, the kernel reads
	// ahead (a window of a block, raiseReadahead) past a block at offset 0
	// or after the previous read, into blocks that are not in the set.
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		return res, fmt.Errorf("%s: %w", f.Name(), err)
	}
	// Read through the mount, as runsc does: this is the set the fetcher
	// serves (the first one recorded), and reading it tells the fetcher
	// which blocks belong to it (base.advised).
	wsPath := filepath.Join(root, MountDir, hexRoot, writeSetName)
	data, err := readWriteSet(wsPath)
	if err == nil && data == nil {
		err = fmt.Errorf("%s does not exist", wsPath)
	}
	if err != nil {
		return res, err
	}
	ranges, err := writeset.Ranges(data, m.Length, id)
	if err != nil {
		return res, fmt.Errorf("%s: %w", wsPath, err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxWriteSetReads)
	for _, b := range writeset.Blocks(ranges, blockmanifest.BlockSize) {
		i := int(b)
		if m.Zero(i) {
			continue
		}
		if res.Read == MaxWriteSetBlocks {
			res.Left++
			continue
		}
		off, n := m.Range(i)
		res.Read++
		res.Bytes += int64(n)
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			buf := make([]byte, n)
			if _, err := f.ReadAt(buf, int64(off)); err != nil && err != io.EOF {
				return fmt.Errorf("reading block %d of base sha256:%s through the lazy fetcher: %w", i, hexRoot, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return WriteSetBlocks{}, err
	}
	return res, nil
}
