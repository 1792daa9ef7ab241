// Package blockmanifest is the block manifest of a shared base: the base cut
// into 2 MiB blocks, the SHA-256 of each block (all-zero blocks marked, never
// stored or fetched), and the root that commits to them, which is the digest
// that `runsc checkpoint --shared-base` records (base.json "sha256",
// pgalloc.DigestBase in the fork):
//
//	root = SHA-256("forkvisor base digest v1\x00" || le64(length) || le64(block size) || entry...)
//
// with one 32-byte entry per block (the last block may be short): all zeroes
// for a block whose bytes are all zero, else the block's SHA-256. A manifest
// is therefore checked against a checkpoint by recomputing its root, and each
// block against the manifest by hashing it, without trusting anything that
// carried them.
package blockmanifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

const (
	// Version is the version of the manifest encoding.
	Version = 1
	// BlockSize is the block size of every base digest.
	BlockSize = 2 << 20
	// MediaType is the media type of an encoded manifest.
	MediaType = "application/vnd.forkvisor.base.blocks.v1+json"

	domain = "forkvisor base digest v1\x00"
)

// Manifest is the block manifest of one base.
type Manifest struct {
	// Version is Version.
	Version int `json:"version"`
	// Length is the base length in bytes.
	Length uint64 `json:"length"`
	// BlockSize is BlockSize.
	BlockSize uint64 `json:"block_size"`
	// Digest is the root, "sha256:<hex>".
	Digest string `json:"digest"`
	// Blocks holds, for each block in order, "sha256:<hex>" of its bytes, or
	// "" for an all-zero block.
	Blocks []string `json:"blocks"`
}

// Zero reports whether block i is all zeroes.
func (m *Manifest) Zero(i int) bool { return m.Blocks[i] == "" }

// ZeroBlocks returns the number of all-zero blocks.
func (m *Manifest) ZeroBlocks() int {
	n := 0
	for i := range m.Blocks {
		if m.Zero(i) {
			n++
		}
	}
	return n
}

// Range returns the byte range [off, off+n) of block i in the base.
func (m *Manifest) Range(i int) (off, n uint64) {
	off = uint64(i) * m.BlockSize
	return off, min(m.BlockSize, m.Length-off)
}

// Root recomputes the root from the block digests.
func (m *Manifest) Root() ([sha256.Size]byte, error) {
	var root [sha256.Size]byte
	h := sha256.New()
	h.Write([]byte(domain))
	var hdr [16]byte
	binary.LittleEndian.PutUint64(hdr[0:], m.Length)
	binary.LittleEndian.PutUint64(hdr[8:], m.BlockSize)
	h.Write(hdr[:])
	var zero [sha256.Size]byte
	for i, b := range m.Blocks {
		if b == "" {
			h.Write(zero[:])
			continue
		}
		sum, err := parseSHA256(b)
		if err != nil {
			return root, fmt.Errorf("block %d: %w", i, err)
		}
		if isZero(sum) {
			// A zero block hashes into the root as this digest: the two
			// spellings must not both be valid.
			return root, fmt.Errorf("block %d: the all-zero digest stands for a zero block, which is listed as \"\"", i)
		}
		h.Write(sum)
	}
	copy(root[:], h.Sum(nil))
	return root, nil
}

// Validate checks that m is well formed and that its blocks commit to its
// root.
func (m *Manifest) Validate() error {
	switch {
	case m.Version != Version:
		return fmt.Errorf("block manifest version %d, want %d", m.Version, Version)
	case m.BlockSize != BlockSize:
		return fmt.Errorf("block manifest block size %d, want %d", m.BlockSize, BlockSize)
	case m.Length == 0:
		return errors.New("block manifest of an empty base")
	case uint64(len(m.Blocks)) != (m.Length-1)/m.BlockSize+1:
		return fmt.Errorf("block manifest lists %d blocks for %d bytes", len(m.Blocks), m.Length)
	}
	want, err := parseSHA256(m.Digest)
	if err != nil {
		return fmt.Errorf("block manifest root: %w", err)
	}
	got, err := m.Root()
	if err != nil {
		return err
	}
	if !bytes.Equal(got[:], want) {
		return fmt.Errorf("block manifest blocks hash to root sha256:%x, not %s", got, m.Digest)
	}
	return nil
}

// Decode decodes and validates an encoded manifest.
func Decode(data []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decoding block manifest: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Encode returns m's encoding.
func (m *Manifest) Encode() []byte {
	out, _ := json.Marshal(m)
	return out
}

// Build reads the first length bytes of f, cutting them into blocks, and
// returns their manifest; visit, if not nil, is called with each non-zero
// block's index, bytes (valid during the call only) and SHA-256 as it is
// read. Holes
// (found with SEEK_DATA) are not read, so a sparse base costs its data, not
// its length.
func Build(f *os.File, length uint64, visit func(i int, block []byte, sum [sha256.Size]byte) error) (*Manifest, error) {
	if length == 0 {
		return nil, fmt.Errorf("%s: empty base", f.Name())
	}
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if uint64(st.Size()) < length {
		return nil, fmt.Errorf("%s is shorter than the base length %d", f.Name(), length)
	}
	m := &Manifest{Version: Version, Length: length, BlockSize: BlockSize}
	buf := make([]byte, BlockSize)
	nextData := int64(-1) // offset of the next data at or after the current block; -1 unknown
	for off, i := uint64(0), 0; off < length; off, i = off+BlockSize, i+1 {
		end := min(off+BlockSize, length)
		if nextData < int64(off) {
			data, err := unix.Seek(int(f.Fd()), int64(off), unix.SEEK_DATA)
			switch {
			case err == unix.ENXIO:
				data = int64(length) // no data up to EOF
			case err != nil:
				return nil, fmt.Errorf("SEEK_DATA in %s at %#x: %w", f.Name(), off, err)
			}
			nextData = data
		}
		if uint64(nextData) >= end {
			m.Blocks = append(m.Blocks, "")
			continue
		}
		block := buf[:end-off]
		if _, err := f.ReadAt(block, int64(off)); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("%s is shorter than the base length %d", f.Name(), length)
			}
			return nil, fmt.Errorf("reading %s at %#x: %w", f.Name(), off, err)
		}
		if isZero(block) {
			m.Blocks = append(m.Blocks, "")
			continue
		}
		sum := sha256.Sum256(block)
		m.Blocks = append(m.Blocks, "sha256:"+hex.EncodeToString(sum[:]))
		if visit != nil {
			if err := visit(i, block, sum); err != nil {
				return nil, err
			}
		}
	}
	root, err := m.Root()
	if err != nil {
		return nil, err
	}
	m.Digest = "sha256:" + hex.EncodeToString(root[:])
	return m, nil
}

func parseSHA256(s string) ([]byte, error) {
	const prefix = "sha256:"
	if len(s) != len(prefix)+2*sha256.Size || s[:len(prefix)] != prefix {
		return nil, fmt.Errorf("%q is not a sha256 digest", s)
	}
	b, err := hex.DecodeString(s[len(prefix):])
	if err != nil || hex.EncodeToString(b) != s[len(prefix):] {
		return nil, fmt.Errorf("%q is not a sha256 digest in lowercase hex", s)
	}
	return b, nil
}

func isZero(b []byte) bool {
	var zero [4096]byte
	for len(b) > 0 {
		n := min(len(b), len(zero))
		if !bytes.Equal(b[:n], zero[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
