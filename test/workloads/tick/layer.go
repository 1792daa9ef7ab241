package main

import (
	"encoding/binary"
	"os"

	"golang.org/x/sys/unix"
)

// layerFile is a file in the container's writable layer filled with a
// pattern; its first page holds a mark once "filemark" ran.
type layerFile struct {
	f      *os.File
	size   int64
	next   int64
	bad    bool
	marked bool
	buf    []byte
}

const pageSize = 4096

// filePattern is the expected 8-byte word at offset off.
func filePattern(off int64) uint64 {
	return pattern(int(off/8)) ^ 0x5a5a5a5a5a5a5a5a
}

func openLayerFile(path string, mib int) (*layerFile, error) {
	size := int64(mib) << 20
	lf := &layerFile{size: size}
	if f, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
		lf.f = f
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		lf.size = st.Size()
		// A restored or adopted layer: a mark may already be there.
		lf.marked = lf.readWord(0) != filePattern(0)
		return lf, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	lf.f = f
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		for i := 0; i < len(buf); i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], filePattern(off+int64(i)))
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			return nil, err
		}
	}
	return lf, f.Sync()
}

func (lf *layerFile) readWord(off int64) uint64 {
	var b [8]byte
	if _, err := lf.f.ReadAt(b[:], off); err != nil {
		lf.bad = true
		return 0
	}
	return binary.LittleEndian.Uint64(b[:])
}

// checkSome checks n bytes of the file (skipping the mark page).
func (lf *layerFile) checkSome(n int) {
	if int64(len(lf.buf)) != min(int64(n), lf.size) {
		lf.buf = make([]byte, min(int64(n), lf.size))
	}
	buf := lf.buf
	if _, err := lf.f.ReadAt(buf, lf.next); err != nil && lf.next+int64(len(buf)) <= lf.size {
		lf.bad = true
		return
	}
	for i := 0; i+8 <= len(buf) && lf.next+int64(i) < lf.size; i += 8 {
		off := lf.next + int64(i)
		if off < pageSize && lf.marked {
			continue
		}
		if binary.LittleEndian.Uint64(buf[i:]) != filePattern(off) {
			lf.bad = true
		}
	}
	lf.next = (lf.next + int64(len(buf))) % lf.size
}

// mark writes a fresh random value over the first page.
func (lf *layerFile) mark() error {
	var b [8]byte
	if _, err := unix.Getrandom(b[:], 0); err != nil {
		return err
	}
	page := make([]byte, pageSize)
	for i := 0; i < pageSize; i += 8 {
		copy(page[i:], b[:])
	}
	if _, err := lf.f.WriteAt(page, 0); err != nil {
		return err
	}
	lf.marked = true
	return lf.f.Sync()
}

func (lf *layerFile) markValue() uint64 {
	if !lf.marked {
		return 0
	}
	return lf.readWord(0)
}

func (lf *layerFile) status() string {
	if lf.bad {
		return "BAD"
	}
	return "ok"
}
