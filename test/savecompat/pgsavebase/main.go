//go:build forkvisor

// Command pgsavebase saves the savecompat MemoryFile (pgfill) synchronously
// against a shared base exported from it, with the fork's pgalloc: the image
// carries the fork's metadata (Version 2). It builds only against the fork.
//
// Usage: pgsavebase OUTDIR
// writes OUTDIR/base.img and OUTDIR/base-sync.img.
package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"gvisor.dev/gvisor/pkg/hostarch"
	"gvisor.dev/gvisor/pkg/sentry/pgalloc"
	"gvisor.dev/gvisor/pkg/sentry/usage"

	"github.com/forkvisor/forkvisor/test/savecompat/pgfill"
)

func run(out string) error {
	mf, err := pgfill.New()
	if err != nil {
		return err
	}
	base, err := os.OpenFile(filepath.Join(out, "base.img"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer base.Close()
	length, digest, err := mf.ExportLinearBase(base)
	if err != nil {
		return fmt.Errorf("exporting the base: %w", err)
	}
	var img bytes.Buffer
	opts := &pgalloc.SaveOpts{SharedBase: &pgalloc.SharedBase{File: base, Length: length, ID: digest[:]}}
	if err := mf.SaveTo(context.Background(), &img, opts); err != nil {
		return fmt.Errorf("SaveTo against the base: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, "base-sync.img"), img.Bytes(), 0o644); err != nil {
		return err
	}
	return saveExternal(out)
}

// saveExternal saves a disk-backed MemoryFile (a filestore) as external
// content: metadata only, to external-sync.img.
func saveExternal(out string) error {
	file, err := os.OpenFile(filepath.Join(out, "filestore"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	mf, err := pgalloc.NewMemoryFile(file, pgalloc.MemoryFileOpts{
		DiskBackedFile:          true,
		DisableMemoryAccounting: true,
		DisableIMAWorkAround:    true,
	})
	if err != nil {
		return err
	}
	if _, err := mf.Allocate(hostarch.PageSize, pgalloc.AllocOpts{Kind: usage.Anonymous, Mode: pgalloc.AllocateAndCommit}); err != nil {
		return err
	}
	var img bytes.Buffer
	if err := mf.SaveTo(context.Background(), &img, &pgalloc.SaveOpts{ExternalContent: true}); err != nil {
		return fmt.Errorf("SaveTo as external content: %w", err)
	}
	return os.WriteFile(filepath.Join(out, "external-sync.img"), img.Bytes(), 0o644)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pgsavebase OUTDIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "pgsavebase: %v\n", err)
		os.Exit(1)
	}
}
