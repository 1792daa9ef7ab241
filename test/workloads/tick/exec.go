package main

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// retInstruction is a function body that returns at once, per architecture.
var retInstruction = map[string][]byte{
	"amd64": {0xc3},                   // ret
	"arm64": {0xc0, 0x03, 0x5f, 0xd6}, // ret
}

// newCodePage maps a private anonymous page, writable and not executable,
// holding a function that returns at once. Written at start, the page is
// part of what a checkpoint saves (and, over a shared base, of the base).
func newCodePage() ([]byte, error) {
	ret, ok := retInstruction[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("no return instruction for %s", runtime.GOARCH)
	}
	page, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, err
	}
	copy(page, ret)
	return page, nil
}

// callCodePage makes page read-only and executable and calls the function at
// its start.
func callCodePage(page []byte) error {
	if err := unix.Mprotect(page, unix.PROT_READ|unix.PROT_EXEC); err != nil {
		return err
	}
	// A Go func value points to a word that holds the code address.
	entry := uintptr(unsafe.Pointer(&page[0]))
	fv := &entry
	fn := *(*func())(unsafe.Pointer(&fv))
	fn()
	return nil
}
