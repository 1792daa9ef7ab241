// Command mkimage writes an OCI image layout tarball holding one static
// binary, for `ctr images import`.
//
// Usage: mkimage OUT.tar REF BINARY [ARG...]
package main

import (
	"fmt"
	"os"

	"github.com/forkvisor/forkvisor/internal/ociimage"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: mkimage OUT.tar REF BINARY [ARG...]")
		os.Exit(2)
	}
	f, err := os.Create(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := ociimage.Write(f, os.Args[2], os.Args[3], os.Args[4:]...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
