// Command pgsave saves a deterministic MemoryFile with pgalloc's SaveTo, both
// synchronously and through an asynchronous pages file, without a shared
// base. savecompat builds it against pristine upstream gVisor and against the
// fork and compares the bytes: without a base, the fork must write exactly
// what upstream writes.
//
// Usage: pgsave OUTDIR
// writes OUTDIR/sync.img, OUTDIR/async-meta.img and OUTDIR/async-pages.img.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/hostarch"
	"gvisor.dev/gvisor/pkg/safemem"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/pgalloc"
	"gvisor.dev/gvisor/pkg/sentry/state/stateio"
	"gvisor.dev/gvisor/pkg/sentry/usage"
)

// fill builds the same MemoryFile every time: pattern pages, zero pages,
// pages written with zeroes, a freed range and committed zero pages.
func fill() (*pgalloc.MemoryFile, error) {
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

func run(out string) error {
	ctx := context.Background()

	mf, err := fill()
	if err != nil {
		return err
	}
	var sync bytes.Buffer
	if err := mf.SaveTo(ctx, &sync, &pgalloc.SaveOpts{}); err != nil {
		return fmt.Errorf("synchronous SaveTo: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, "sync.img"), sync.Bytes(), 0644); err != nil {
		return err
	}

	mf, err = fill()
	if err != nil {
		return err
	}
	pages, err := os.Create(filepath.Join(out, "async-pages.img"))
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	apfs, err := pgalloc.StartAsyncPagesFileSave(stateio.NewPagesFileFDWriterDefault(int32(pages.Fd())), func(err error) { done <- err })
	if err != nil {
		return err
	}
	var meta bytes.Buffer
	saveErr := mf.SaveTo(ctx, &meta, &pgalloc.SaveOpts{PagesFile: apfs, ExcludeCommittedZeroPages: true})
	apfs.MemoryFilesDone()
	if err := <-done; err != nil {
		return fmt.Errorf("async page saving: %w", err)
	}
	if saveErr != nil {
		return fmt.Errorf("asynchronous SaveTo: %w", saveErr)
	}
	return os.WriteFile(filepath.Join(out, "async-meta.img"), meta.Bytes(), 0644)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pgsave OUTDIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "pgsave: %v\n", err)
		os.Exit(1)
	}
}
