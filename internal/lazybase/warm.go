package lazybase

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sync/errgroup"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// maxWarmReads bounds the blocks that FetchWriteSetBlocks reads at once; the
// fetcher bounds the node's registry fetches on its own (maxFetches).
const maxWarmReads = 4

// FetchWriteSetBlocks reads every block of base hexRoot that the write set
// served beside it touches, through the running fetcher's mount in the
// store at root, and returns how many blocks and bytes that was.
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
func FetchWriteSetBlocks(ctx context.Context, root, hexRoot string) (blocks int, bytes int64, err error) {
	id, err := hex.DecodeString(hexRoot)
	if err != nil || !hexDigest.MatchString(hexRoot) {
		return 0, 0, fmt.Errorf("%q is not a sha256 hex digest", hexRoot)
	}
	f, err := os.Open(Path(root, hexRoot))
	if err != nil {
		return 0, 0, fmt.Errorf("the lazy fetcher does not serve the base (is lazyd running on %s?): %w", filepath.Join(root, MountDir), err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	length := uint64(st.Size())
	// Read through the mount, as runsc does: this is the set the fetcher
	// serves (the first one recorded), and reading it tells the fetcher
	// which blocks belong to it (base.advised).
	wsPath := filepath.Join(root, MountDir, hexRoot, writeSetName)
	data, err := readWriteSet(wsPath)
	if err == nil && data == nil {
		err = fmt.Errorf("%s does not exist", wsPath)
	}
	if err != nil {
		return 0, 0, err
	}
	ranges, err := writeset.Ranges(data, length, id)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", wsPath, err)
	}
	var list []int64 // block indices, ascending, each once
	for _, r := range ranges {
		for i := int64(r[0] / blockmanifest.BlockSize); i < int64((r[1]+blockmanifest.BlockSize-1)/blockmanifest.BlockSize); i++ {
			if len(list) == 0 || list[len(list)-1] != i {
				list = append(list, i)
			}
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxWarmReads)
	for _, i := range list {
		off := i * blockmanifest.BlockSize
		n := min(int64(blockmanifest.BlockSize), int64(length)-off)
		bytes += n
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			buf := make([]byte, n)
			if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
				return fmt.Errorf("reading block %d of base sha256:%s through the lazy fetcher: %w", i, hexRoot, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	return len(list), bytes, nil
}
