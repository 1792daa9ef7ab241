// Command pgsave saves a deterministic MemoryFile with pgalloc's SaveTo, both
// synchronously and through an asynchronous pages file, without a shared
// base. savecompat builds it against pristine upstream gVisor and against the
// fork and compares the bytes: without a base, the fork must write exactly
// what upstream writes.
//
// Usage: pgsave OUTDIR
// writes OUTDIR/sync.img, OUTDIR/async-meta.img and OUTDIR/async-pages.img.
//
// pgsave -load IMG loads the synchronous image IMG into a new MemoryFile:
// exit 0 if it loads, 3 with the loader's error if it is refused (e.g. an
// image of a newer format, loaded by an upstream build).
package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/pgalloc"
	"gvisor.dev/gvisor/pkg/sentry/state/stateio"

	"github.com/forkvisor/forkvisor/test/savecompat/pgfill"
)

func run(out string) error {
	ctx := context.Background()

	mf, err := pgfill.New()
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

	mf, err = pgfill.New()
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

// load loads the synchronous image at path into a new MemoryFile.
func load(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fd, err := unix.MemfdCreate("pgload", 0)
	if err != nil {
		return fmt.Errorf("memfd_create: %w", err)
	}
	mf, err := pgalloc.NewMemoryFile(os.NewFile(uintptr(fd), "memfd"), pgalloc.MemoryFileOpts{
		DisableMemoryAccounting: true,
		DisableIMAWorkAround:    true,
	})
	if err != nil {
		return err
	}
	return mf.LoadFrom(context.Background(), bytes.NewReader(data), &pgalloc.LoadOpts{})
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-load" {
		if err := load(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "pgsave: loading %s: %v\n", os.Args[2], err)
			os.Exit(3)
		}
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pgsave OUTDIR | pgsave -load IMG")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "pgsave: %v\n", err)
		os.Exit(1)
	}
}
