// Package writeset checks a shared base's write set (runsc's base.writeset)
// before it leaves or reaches a node.
//
// A write set lists the pages that clones of one base write right after a
// restore; runsc copies them eagerly instead of sharing them. Its encoding
// is the fork's (pgalloc.EncodeWriteSet in the gVisor tree, which this
// module does not import: the fork exists only as a patch series):
//
//	magic "GVWRSET\x00" | version u32 | 0 u32 | base length u64 |
//	ID length u32 | 0 u32 | ID | range count u64 | (start u64, end u64)... |
//	SHA-256 of everything before it
//
// all little-endian. Check accepts exactly what runsc's decoder accepts:
// the framing, the version, zero reserved fields, the base it belongs to,
// the checksum (which tells a complete set from a torn or truncated one),
// and ranges that are page-aligned, non-empty, within the base, ascending
// and separate. runsc checks a set again before it applies it; a set is
// only a hint of what to copy eagerly, so nothing here decides what bytes a
// sandbox sees.
package writeset

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Encode encodes a write set of the base with length and id holding ranges
// ([start, end) byte offsets, page-aligned, ascending), as runsc does. The
// tools here only move sets that runsc learned; tests build sets with it.
func Encode(length uint64, id []byte, ranges [][2]uint64) []byte {
	var b bytes.Buffer
	b.Write(magic)
	le := binary.LittleEndian
	b.Write(le.AppendUint32(nil, Version))
	b.Write(le.AppendUint32(nil, 0))
	b.Write(le.AppendUint64(nil, length))
	b.Write(le.AppendUint32(nil, uint32(len(id))))
	b.Write(le.AppendUint32(nil, 0))
	b.Write(id)
	b.Write(le.AppendUint64(nil, uint64(len(ranges))))
	for _, r := range ranges {
		b.Write(le.AppendUint64(nil, r[0]))
		b.Write(le.AppendUint64(nil, r[1]))
	}
	sum := sha256.Sum256(b.Bytes())
	return append(b.Bytes(), sum[:]...)
}

// Name is a write set's file name beside its base.img.
const Name = "base.writeset"

// Version is the encoding version Check accepts.
const Version = 1

// MaxBytes bounds the write sets that travel between nodes: 16 bytes per
// range, so a million ranges.
const MaxBytes = 16 << 20

var magic = []byte("GVWRSET\x00")

// pageSize is the granularity of write set ranges.
const pageSize = 4096

// fixedLen is the length of the fields before the ID.
const fixedLen = 8 + 4 + 4 + 8 + 4 + 4

// Complete reports whether data starts like a write set: the restore that
// learns one creates its file empty and then writes it whole, so a file
// without the magic is still being learned.
func Complete(data []byte) bool { return bytes.HasPrefix(data, magic) }

// Check returns nil if data is a complete write set, in the version runsc
// reads, of the base with the given length and ID (its SHA-256 root), or an
// error that says what is wrong.
func Check(data []byte, length uint64, id []byte) error {
	_, err := Ranges(data, length, id)
	return err
}

// Ranges checks data as Check does and returns its ranges ([start, end)
// byte offsets into the base, page-aligned, ascending and separate).
func Ranges(data []byte, length uint64, id []byte) ([][2]uint64, error) {
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("write set is %d bytes, more than %d", len(data), MaxBytes)
	}
	if len(data) < fixedLen+8+sha256.Size {
		return nil, fmt.Errorf("write set is %d bytes, too short", len(data))
	}
	if !Complete(data) {
		return nil, errors.New("not a write set (bad magic)")
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, errors.New("write set checksum mismatch (truncated or modified)")
	}
	le := binary.LittleEndian
	if v := le.Uint32(body[8:]); v != Version {
		return nil, fmt.Errorf("write set version %d, want %d", v, Version)
	}
	if le.Uint32(body[12:]) != 0 || le.Uint32(body[28:]) != 0 {
		return nil, errors.New("write set has non-zero reserved fields")
	}
	if l := le.Uint64(body[16:]); l != length {
		return nil, fmt.Errorf("write set is for a base of %d bytes, this base has %d", l, length)
	}
	idLen := uint64(le.Uint32(body[24:]))
	if uint64(len(body)) < fixedLen+idLen+8 || !bytes.Equal(body[fixedLen:fixedLen+idLen], id) {
		return nil, fmt.Errorf("write set is not for base %x", id)
	}
	ranges := body[fixedLen+idLen+8:]
	if count := le.Uint64(body[fixedLen+idLen:]); count > uint64(len(ranges))/16 || uint64(len(ranges)) != count*16 {
		return nil, fmt.Errorf("write set claims %d ranges in %d bytes", count, len(ranges))
	}
	out := make([][2]uint64, 0, len(ranges)/16)
	var prevEnd uint64
	for i := 0; i < len(ranges); i += 16 {
		start, end := le.Uint64(ranges[i:]), le.Uint64(ranges[i+8:])
		switch {
		case start%pageSize != 0 || end%pageSize != 0:
			return nil, fmt.Errorf("write set range [%#x, %#x) is not page-aligned", start, end)
		case start >= end:
			return nil, fmt.Errorf("write set range [%#x, %#x) is empty or inverted", start, end)
		case end > length:
			return nil, fmt.Errorf("write set range [%#x, %#x) extends past the base (%d bytes)", start, end, length)
		case i > 0 && start <= prevEnd:
			return nil, fmt.Errorf("write set range [%#x, %#x) is not after the previous one and separate from it", start, end)
		}
		prevEnd = end
		out = append(out, [2]uint64{start, end})
	}
	return out, nil
}

// Blocks returns the indices of the blockSize blocks of the base that
// ranges (as Ranges returns them: ascending and separate) overlap,
// ascending, each once.
func Blocks(ranges [][2]uint64, blockSize uint64) []uint64 {
	var blocks []uint64
	for _, r := range ranges {
		for i := r[0] / blockSize; i < (r[1]+blockSize-1)/blockSize; i++ {
			if len(blocks) == 0 || blocks[len(blocks)-1] < i {
				blocks = append(blocks, i)
			}
		}
	}
	return blocks
}
