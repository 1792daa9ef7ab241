// Command forkvisor-oci pushes a parked sandbox (a runsc checkpoint image
// directory; one saved with `runsc checkpoint --shared-base` travels as a
// delta plus a content-addressed base) to an OCI registry, and pulls it on
// another node into an image directory plus the node base store, verified.
// See package internal/ociartifact for the artifact layout.
//
//	forkvisor-oci [--plain-http] [--base-store DIR] push IMAGE_DIR REF
//	forkvisor-oci [--plain-http] [--base-store DIR] [--runsc BIN] pull REF IMAGE_DIR
//
// Credentials come from the Docker configuration file. A progress bar is
// shown on a terminal (stderr), nothing otherwise; the summary goes to
// stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/ociartifact"
)

func main() {
	plainHTTP := flag.Bool("plain-http", false, "talk HTTP instead of HTTPS to the registry (a registry on loopback)")
	store := flag.String("base-store", "/var/lib/runsc/bases", "the node base store (runsc --base-store)")
	runsc := flag.String("runsc", "", "the fork's runsc, which verifies and stores pulled bases (default: runsc beside this binary, else on PATH)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage:\n  %[1]s [flags] push IMAGE_DIR REF\n  %[1]s [flags] pull REF IMAGE_DIR\nflags:\n", filepath.Base(os.Args[0]))
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 3 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := ociartifact.Options{PlainHTTP: *plainHTTP}
	if isTerminal(os.Stderr) {
		opts.Progress = os.Stderr
	}
	var err error
	switch flag.Arg(0) {
	case "push":
		err = push(ctx, os.Stdout, flag.Arg(1), *store, flag.Arg(2), opts)
	case "pull":
		err = pull(ctx, os.Stdout, flag.Arg(1), flag.Arg(2), ociartifact.BaseStore{Root: *store, Runsc: runscBinary(*runsc)}, opts)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "forkvisor-oci %s: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
}

func push(ctx context.Context, w io.Writer, imageDir, store, ref string, opts ociartifact.Options) error {
	res, err := ociartifact.Push(ctx, imageDir, store, ref, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "pushed %s@%s\n", ref, res.Manifest.Digest)
	if res.BaseDigest != "" {
		fmt.Fprintf(w, "base %s: %d blocks, %d zero (not pushed), %d uploaded; base manifest %s\n",
			res.BaseDigest, res.Blocks, res.ZeroBlocks, res.BlocksPushed, res.BaseManifest.Digest)
	}
	fmt.Fprintf(w, "uploaded %d bytes\n", res.BytesPushed)
	return nil
}

func pull(ctx context.Context, w io.Writer, ref, imageDir string, store ociartifact.BaseStore, opts ociartifact.Options) error {
	res, err := ociartifact.Pull(ctx, ref, imageDir, store, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "pulled %s into %s: %d files\n", ref, imageDir, len(res.Files))
	switch {
	case res.BaseDigest == "":
		fmt.Fprintln(w, "no shared base")
	case res.BaseWasStored:
		fmt.Fprintf(w, "base %s: already stored, nothing fetched\n", res.BaseDigest)
	default:
		fmt.Fprintf(w, "base %s: %d blocks, %d zero (not fetched), %d fetched and verified, stored in %s\n",
			res.BaseDigest, res.Blocks, res.ZeroBlocks, res.BlocksFetched, store.Root)
	}
	fmt.Fprintf(w, "fetched %d bytes\n", res.BytesFetched)
	return nil
}

// runscBinary returns flagValue, or runsc beside this binary, or runsc on
// PATH.
func runscBinary(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "runsc")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return "runsc"
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
