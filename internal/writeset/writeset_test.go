package writeset

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
)

// encode is Encode with another version, for the version check; the e2e
// tests check Check against sets that runsc learned.
func encode(version uint32, length uint64, id []byte, ranges [][2]uint64) []byte {
	b := Encode(length, id, ranges)
	body := b[:len(b)-sha256.Size]
	binary.LittleEndian.PutUint32(body[8:], version)
	sum := sha256.Sum256(body)
	return append(body, sum[:]...)
}

// resum returns a copy of set changed by change, with its checksum
// computed again.
func resum(change func([]byte), set []byte) []byte {
	body := bytes.Clone(set[:len(set)-sha256.Size])
	change(body)
	sum := sha256.Sum256(body)
	return append(body, sum[:]...)
}

func TestCheck(t *testing.T) {
	const length = 1 << 30
	id := bytes.Repeat([]byte{0xab}, 32)
	valid := encode(Version, length, id, [][2]uint64{{0, 4096}, {8192, 16384}})
	flipped := bytes.Clone(valid)
	flipped[40] ^= 1
	reserved := resum(func(b []byte) { b[12] = 1 }, valid)
	for _, tc := range []struct {
		name string
		data []byte
		want string // "" for valid
	}{
		{"valid", valid, ""},
		{"no ranges", encode(Version, length, id, nil), ""},
		{"empty (being learned)", nil, "too short"},
		{"truncated", valid[:len(valid)-1], "checksum mismatch"},
		{"a flipped bit", flipped, "checksum mismatch"},
		{"not a write set", append([]byte("GVWRSEX\x00"), valid[8:]...), "bad magic"},
		{"another version", encode(Version+1, length, id, nil), "version 2"},
		{"another base's length", encode(Version, length*2, id, nil), "base of 2147483648 bytes"},
		{"another base", encode(Version, length, make([]byte, 32), nil), "not for base"},
		{"too large", make([]byte, MaxBytes+1), "more than"},
		{"reserved field set", reserved, "reserved"},
		{"unaligned range", encode(Version, length, id, [][2]uint64{{0, 100}}), "not page-aligned"},
		{"empty range", encode(Version, length, id, [][2]uint64{{4096, 4096}}), "empty or inverted"},
		{"range past the base", encode(Version, length, id, [][2]uint64{{0, length + 4096}}), "past the base"},
		{"adjacent ranges", encode(Version, length, id, [][2]uint64{{0, 4096}, {4096, 8192}}), "not after the previous one"},
		{"descending ranges", encode(Version, length, id, [][2]uint64{{8192, 12288}, {0, 4096}}), "not after the previous one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.data, length, id)
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Check = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRangesRoundTrip(t *testing.T) {
	const length = 1 << 30
	id := bytes.Repeat([]byte{0xcd}, 32)
	want := [][2]uint64{{0, 4096}, {8192, 3 << 20}, {length - 4096, length}}
	got, err := Ranges(Encode(length, id, want), length, id)
	if err != nil || len(got) != len(want) {
		t.Fatalf("Ranges = %v, %v; want %v", got, err, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("range %d = %v, want %v", i, got[i], want[i])
		}
	}
	if got, err := Ranges(Encode(length, id, want), length, make([]byte, 32)); err == nil || got != nil {
		t.Errorf("Ranges of another base's set = %v, %v; want nil and an error", got, err)
	}
}

func TestBlocks(t *testing.T) {
	const bs = 2 << 20
	for _, tc := range []struct {
		name   string
		ranges [][2]uint64
		want   []uint64
	}{
		{"none", nil, nil},
		{"one page", [][2]uint64{{bs + 4096, bs + 8192}}, []uint64{1}},
		{"two ranges in one block", [][2]uint64{{0, 4096}, {8192, 12288}}, []uint64{0}},
		{"across a boundary", [][2]uint64{{bs - 4096, bs + 4096}}, []uint64{0, 1}},
		{"a whole block", [][2]uint64{{2 * bs, 3 * bs}}, []uint64{2}},
		{"ending in the next block's first page and starting there", [][2]uint64{{bs - 4096, bs + 4096}, {bs + 8192, bs + 12288}, {5 * bs, 5*bs + 4096}}, []uint64{0, 1, 5}},
	} {
		if got := Blocks(tc.ranges, bs); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Blocks(%v) = %v, want %v", tc.name, tc.ranges, got, tc.want)
		}
	}
}
