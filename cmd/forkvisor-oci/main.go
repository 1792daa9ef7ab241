// Command forkvisor-oci pushes a parked sandbox (a runsc checkpoint image
// directory; one saved with `runsc checkpoint --shared-base` travels as a
// delta plus a content-addressed base) to an OCI registry, and pulls it on
// another node into an image directory plus the node base store, verified.
// See package internal/ociartifact for the artifact layout.
//
//	forkvisor-oci [--plain-http] [--base-store DIR] push IMAGE_DIR REF
//	forkvisor-oci [--plain-http] [--base-store DIR] [--runsc BIN] [--lazy] pull REF IMAGE_DIR
//	forkvisor-oci [--base-store DIR] lazyd
//
// With --lazy, pull fetches only the checkpoint files and the base's block
// manifest, and registers the base with the node's lazy fetcher: lazyd, run
// once per node (as root, for as long as sandboxes use its bases), serves it
// in the store, fetching and verifying each block on its first touch
// (package internal/lazybase). runsc restore finds it there.
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
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/lazybase"
	"github.com/forkvisor/forkvisor/internal/ociartifact"
)

func main() {
	plainHTTP := flag.Bool("plain-http", false, "talk HTTP instead of HTTPS to the registry (a registry on loopback)")
	store := flag.String("base-store", "/var/lib/runsc/bases", "the node base store (runsc --base-store)")
	runsc := flag.String("runsc", "", "the fork's runsc, which verifies and stores pulled bases (default: runsc beside this binary, else on PATH)")
	lazy := flag.Bool("lazy", false, "pull: leave a base that the store lacks to the node's lazy fetcher (lazyd), which fetches each block on its first touch")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage:\n  %[1]s [flags] push IMAGE_DIR REF\n  %[1]s [flags] pull REF IMAGE_DIR\n  %[1]s [flags] lazyd\nflags:\n", filepath.Base(os.Args[0]))
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 || flag.NArg() != map[string]int{"push": 3, "pull": 3, "lazyd": 1}[flag.Arg(0)] {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := ociartifact.Options{PlainHTTP: *plainHTTP, Lazy: *lazy}
	if isTerminal(os.Stderr) {
		opts.Progress = os.Stderr
	}
	var err error
	switch flag.Arg(0) {
	case "push":
		err = push(ctx, os.Stdout, flag.Arg(1), *store, flag.Arg(2), opts)
	case "pull":
		err = pull(ctx, os.Stdout, flag.Arg(1), flag.Arg(2), ociartifact.BaseStore{Root: *store, Runsc: runscBinary(*runsc)}, opts)
	case "lazyd":
		err = serveLazy(ctx, stop, *store)
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
		switch {
		case res.WriteSetBytes > 0:
			fmt.Fprintf(w, "base write set: %d bytes, pushed with the checkpoint\n", res.WriteSetBytes)
		case res.WriteSetSkipped != "":
			fmt.Fprintf(w, "base write set: not pushed: %s\n", res.WriteSetSkipped)
		default:
			fmt.Fprintln(w, "base write set: none learned on this node yet, not pushed")
		}
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
	case res.BaseLazy:
		fmt.Fprintf(w, "base %s: %d blocks, %d zero; left to the lazy fetcher, served at %s\n",
			res.BaseDigest, res.Blocks, res.ZeroBlocks, lazybase.Path(store.Root, strings.TrimPrefix(res.BaseDigest, "sha256:")))
	case res.BaseWasStored:
		fmt.Fprintf(w, "base %s: already stored, nothing fetched\n", res.BaseDigest)
	default:
		fmt.Fprintf(w, "base %s: %d blocks, %d zero (not fetched), %d fetched and verified, stored in %s\n",
			res.BaseDigest, res.Blocks, res.ZeroBlocks, res.BlocksFetched, store.Root)
	}
	if res.WriteSet != "" {
		fmt.Fprintf(w, "base write set: %s\n", res.WriteSet)
	}
	if res.WriteSetBlocks != "" {
		fmt.Fprintf(w, "base write set's blocks, through the lazy fetcher: %s\n", res.WriteSetBlocks)
	}
	fmt.Fprintf(w, "fetched %d bytes\n", res.BytesFetched)
	return nil
}

// serveLazy runs the node's lazy fetcher for the store at root until ctx is
// done (SIGINT or SIGTERM), then unmounts it; stop restores the signals'
// default action, so that a second signal ends a fetcher that waits for
// sandboxes to let go of its mount.
func serveLazy(ctx context.Context, stop func(), root string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the lazy fetcher mounts a filesystem in %s: run it as root", root)
	}
	srv, err := lazybase.Serve(root, ociartifact.BlockFetcher)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "serving lazy bases at %s\n", filepath.Join(root, lazybase.MountDir))
	done := make(chan struct{})
	go func() {
		srv.Wait()
		close(done)
	}()
	select {
	case <-ctx.Done():
		stop()
		if err := srv.Unmount(); err != nil {
			// Sandboxes still map a base: detach the mount. Their reads
			// of base pages that are not in the page cache fail from
			// now on (SIGBUS in the guest); the fetcher serves what is
			// in flight until the last of them closes the file.
			fmt.Fprintf(os.Stderr, "lazy fetcher: %v; detaching the mount, sandboxes that still map a base fail their next read that misses the page cache\n", err)
			unix.Unmount(filepath.Join(root, lazybase.MountDir), unix.MNT_DETACH)
		}
		<-done
	case <-done:
	}
	st := srv.Stats()
	fmt.Fprintf(os.Stdout, "lazy fetcher stopped: %d blocks (%d bytes) fetched, %d found in the node cache, %d failures\n", st.BlocksFetched, st.BytesFetched, st.BlocksVerifiedLocal, st.Failures)
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
