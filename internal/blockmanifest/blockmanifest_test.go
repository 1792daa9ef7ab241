package blockmanifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeBase writes a base of two data blocks around a zero block and a short
// last block, and returns it open.
func writeBase(t *testing.T) (*os.File, uint64) {
	t.Helper()
	const length = 3*BlockSize + 8192
	f, err := os.Create(filepath.Join(t.TempDir(), "base.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(length); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 2 * BlockSize, 3 * BlockSize} {
		if _, err := f.WriteAt([]byte("block at "+strings.Repeat("x", int(off/BlockSize))), off+100); err != nil {
			t.Fatal(err)
		}
	}
	return f, length
}

func TestBuildMarksZeroBlocksAndCommitsToThem(t *testing.T) {
	f, length := writeBase(t)
	var visited []int
	sums := map[int]string{}
	m, err := Build(f, length, func(i int, b []byte, sum [sha256.Size]byte) error {
		visited = append(visited, i)
		if got := sha256.Sum256(b); got != sum {
			t.Errorf("block %d: visit got sum %x for bytes that hash to %x", i, sum, got)
		}
		sums[i] = "sha256:" + hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Blocks) != 4 || !m.Zero(1) || m.Zero(0) || m.Zero(2) || m.Zero(3) || m.ZeroBlocks() != 1 {
		t.Fatalf("blocks %q: want block 1 (only) zero", m.Blocks)
	}
	if len(visited) != 3 || visited[0] != 0 || visited[1] != 2 || visited[2] != 3 {
		t.Errorf("visited blocks %v, want [0 2 3]", visited)
	}
	for i, sum := range sums {
		if m.Blocks[i] != sum {
			t.Errorf("block %d: manifest says %s, the bytes visited hash to %s", i, m.Blocks[i], sum)
		}
	}
	if off, n := m.Range(3); off != 3*BlockSize || n != 8192 {
		t.Errorf("Range(3) = %d, %d", off, n)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	got, err := Decode(m.Encode())
	if err != nil || got.Digest != m.Digest {
		t.Fatalf("Decode(Encode()) = %+v, %v", got, err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	f, length := writeBase(t)
	m, err := Build(f, length, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := "sha256:" + strings.Repeat("ab", sha256.Size)
	for _, tc := range []struct {
		name   string
		change func(m *Manifest)
		want   string
	}{
		{"changed block digest", func(m *Manifest) { m.Blocks[0] = other }, "hash to root"},
		{"data block marked zero", func(m *Manifest) { m.Blocks[2] = "" }, "hash to root"},
		{"zero block given data", func(m *Manifest) { m.Blocks[1] = other }, "hash to root"},
		{"zero block spelled as the all-zero digest", func(m *Manifest) { m.Blocks[1] = "sha256:" + strings.Repeat("00", sha256.Size) }, "all-zero digest"},
		{"other root", func(m *Manifest) { m.Digest = other }, "hash to root"},
		{"longer base", func(m *Manifest) { m.Length += 4096 }, "hash to root"},
		{"block missing", func(m *Manifest) { m.Blocks = m.Blocks[:3] }, "lists 3 blocks"},
		{"version", func(m *Manifest) { m.Version = 2 }, "version 2"},
		{"block size", func(m *Manifest) { m.BlockSize = 4096 }, "block size 4096"},
		{"malformed digest", func(m *Manifest) { m.Blocks[0] = "md5:00" }, "not a sha256 digest"},
		{"uppercase prefix", func(m *Manifest) { m.Blocks[0] = strings.ToUpper(m.Blocks[0][:7]) + m.Blocks[0][7:] }, "not a sha256 digest"},
		{"uppercase hex", func(m *Manifest) { m.Blocks[0] = m.Blocks[0][:7] + strings.ToUpper(m.Blocks[0][7:]) }, "in lowercase hex"},
		{"length that overflows the block count", func(m *Manifest) { m.Length = ^uint64(0) - 100; m.Blocks = nil }, "lists 0 blocks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := *m
			c.Blocks = append([]string(nil), m.Blocks...)
			tc.change(&c)
			if _, err := Decode(c.Encode()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("unknown field", func(t *testing.T) {
		var raw map[string]any
		json.Unmarshal(m.Encode(), &raw)
		raw["extra"] = 1
		data, _ := json.Marshal(raw)
		if _, err := Decode(data); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("Decode = %v", err)
		}
	})
}

func TestBuildRefusesShortFile(t *testing.T) {
	f, length := writeBase(t)
	if _, err := Build(f, length+BlockSize, nil); err == nil || !strings.Contains(err.Error(), "shorter than") {
		t.Errorf("Build past EOF = %v", err)
	}
}

// goldenRoot is the root of goldenBase, as the fork's pgalloc.DigestBase
// computes it (its test TestDigestBaseGolden pins the same value): if either
// side changes its domain string, header or entries, one of the two tests
// fails.
const goldenRoot = "sha256:3696562730429f4220f0889013cf7f83c490aafaa3c6ebfca6a8776aa1b48f66"

// goldenBase writes the golden base: a block of i%251 bytes, a zero block, a
// block holding "forkvisor" at offset 100, and a short block of 0xff.
func goldenBase(t *testing.T) (*os.File, uint64) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "golden.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	const length = 3*BlockSize + 8192
	b0 := make([]byte, BlockSize)
	for i := range b0 {
		b0[i] = byte(i % 251)
	}
	last := bytes.Repeat([]byte{0xff}, 8192)
	for _, err := range []error{
		f.Truncate(length),
		writeAt(f, b0, 0),
		writeAt(f, []byte("forkvisor"), 2*BlockSize+100),
		writeAt(f, last, 3*BlockSize),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return f, length
}

func writeAt(f *os.File, b []byte, off int64) error {
	_, err := f.WriteAt(b, off)
	return err
}

func TestRootMatchesTheForksDigest(t *testing.T) {
	f, length := goldenBase(t)
	m, err := Build(f, length, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Digest != goldenRoot {
		t.Errorf("root of the golden base = %s, want %s (pgalloc.DigestBase's)", m.Digest, goldenRoot)
	}
}
