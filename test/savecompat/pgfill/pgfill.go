// Package pgfill builds the deterministic MemoryFile that the savecompat
// programs save: pattern pages, zero pages, pages written with zeroes, a
// freed range and committed zero pages. It uses only upstream pgalloc APIs,
// so it builds against pristine upstream and against the fork.
package pgfill

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/hostarch"
	"gvisor.dev/gvisor/pkg/safemem"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/pgalloc"
	"gvisor.dev/gvisor/pkg/sentry/usage"
)

// New builds the same MemoryFile every time: pattern pages, zero pages,
// pages written with zeroes, a freed range and committed zero pages.
func New() (*pgalloc.MemoryFile, error) {
	fd, err := unix.MemfdCreate("pgsave", 0)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	mf, err := pgalloc.NewMemoryFile(os.NewFile(uintptr(fd), "memfd"), pgalloc.MemoryFileOpts{
		DisableMemoryAccounting: true,
		DisableIMAWorkAround:    true,
	})
	if err != nil {
		return nil, err
	}
	alloc := func(pages int, mode pgalloc.AllocationMode) (memmap.FileRange, error) {
		return mf.Allocate(uint64(pages)*hostarch.PageSize, pgalloc.AllocOpts{Kind: usage.Anonymous, Mode: mode})
	}
	write := func(off uint64, b []byte) error {
		ims, err := mf.MapInternal(memmap.FileRange{Start: off, End: off + uint64(len(b))}, hostarch.Write)
		if err != nil {
			return err
		}
		_, err = safemem.CopySeq(ims, safemem.BlockSeqOf(safemem.BlockFromSafeSlice(b)))
		return err
	}
	page := func(i int) []byte {
		b := make([]byte, hostarch.PageSize)
		for j := 0; j < len(b); j += 8 {
			binary.LittleEndian.PutUint64(b[j:], uint64(i)<<20|uint64(j)|1)
		}
		return b
	}

	a, err := alloc(64, pgalloc.AllocateAndWritePopulate)
	if err != nil {
		return nil, err
	}
	for i := 0; i < 64; i++ {
		switch {
		case i%5 == 0: // never written
		case i%7 == 0:
			err = write(a.Start+uint64(i)*hostarch.PageSize, make([]byte, hostarch.PageSize))
		default:
			err = write(a.Start+uint64(i)*hostarch.PageSize, page(i))
		}
		if err != nil {
			return nil, err
		}
	}
	b, err := alloc(32, pgalloc.AllocateAndCommit)
	if err != nil {
		return nil, err
	}
	if err := write(b.Start+3*hostarch.PageSize, page(1000)); err != nil {
		return nil, err
	}
	mf.DecRef(memmap.FileRange{Start: b.Start + 16*hostarch.PageSize, End: b.End})
	c, err := alloc(8, pgalloc.AllocateUncommitted)
	if err != nil {
		return nil, err
	}
	if err := write(c.Start, page(2000)); err != nil {
		return nil, err
	}
	return mf, nil
}
