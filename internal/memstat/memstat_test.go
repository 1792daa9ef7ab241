package memstat

import (
	"bufio"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestMappingKind(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"", KindAnon},
		{"[heap]", KindAnon},
		{"[stack]", KindAnon},
		{"[anon:gvisor]", KindAnon},
		{"[vdso]", KindFile},
		{"/memfd:runsc-memory (deleted)", KindGuest},
		{"/memfd:systrap-memory (deleted)", KindPlatform},
		{"/memfd:flipcall_packet_windows (deleted)", KindAnon},
		{"/var/lib/runsc/bases/sha256/ab/base.img", KindBase},
		{"/tmp/image dir/base.img (deleted)", KindBase},
		{"/tmp/image/base.img.tmp", KindFile},
		{"/usr/local/bin/runsc", KindFile},
	} {
		if got := mappingKind(tc.path); got != tc.want {
			t.Errorf("mappingKind(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestParseSmaps(t *testing.T) {
	const smaps = `00400000-00c00000 r-xp 00000000 08:01 123 /usr/local/bin/runsc
Rss:                1000 kB
Pss:                 500 kB
7f0000000000-7f0010000000 rw-s 00000000 00:01 5 /memfd:runsc-memory (deleted)
Pss:                4096 kB
7f0010000000-7f0020000000 r--s 00000000 08:01 77 /tmp/image dir/base.img
Pss:                 100 kB
7f0020000000-7f0020100000 rw-p 00000000 00:00 0 
Pss:                  64 kB
7f0030000000-7f0030100000 rw-p 00000000 00:00 0
Pss:                  16 kB
Pss_Dirty:            16 kB
`
	got := map[string]uint64{}
	if err := parseSmaps(bufio.NewScanner(strings.NewReader(smaps)), got); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{KindFile: 500, KindGuest: 4096, KindBase: 100, KindAnon: 80}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseSmaps = %v, want %v", got, want)
	}
	for _, bad := range []string{"Pss: 4 kB\n", "00400000-00c00000 r-xp\n", "00400000-00c00000 r-xp 0 08:01 1 /x\nPss: x kB\n"} {
		if err := parseSmaps(bufio.NewScanner(strings.NewReader(bad)), map[string]uint64{}); err == nil {
			t.Errorf("parseSmaps(%q) succeeded, want an error", bad)
		}
	}
}

// TestBreakdownMatchesRollup checks Breakdown against the kernel's own sum
// for this process: the kinds add up to smaps_rollup's Pss.
func TestBreakdownMatchesRollup(t *testing.T) {
	pid := os.Getpid()
	byKind, err := Breakdown([]int{pid, pid})
	if err != nil {
		t.Fatal(err)
	}
	roll, err := Rollup(pid)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, v := range byKind {
		sum += v
	}
	// The two reads are moments apart; allow this process's heap to move.
	if diff := int64(sum) - int64(roll.Pss); diff > 2048 || diff < -2048 {
		t.Errorf("Breakdown sums to %d KiB, smaps_rollup says %d KiB", sum, roll.Pss)
	}
	if byKind[KindAnon] == 0 || byKind[KindFile] == 0 {
		t.Errorf("Breakdown = %v: want anonymous memory and this test binary's text", byKind)
	}
}
