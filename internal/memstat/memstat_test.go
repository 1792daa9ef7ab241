package memstat

import (
	"bufio"
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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

// TestUnmappedGuest checks that a MemoryFile's pages count whether or not a
// process maps them: pages written with pwrite (as the fork's restore fills
// a write set) are in Breakdown's KindGuest and in UnmappedGuest until they
// are mapped, then in Pss and not counted twice.
func TestUnmappedGuest(t *testing.T) {
	fd, err := unix.MemfdCreate("runsc-memory", 0)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	const size = 4 << 20
	if _, err := unix.Pwrite(fd, bytes.Repeat([]byte{1}, size), 0); err != nil {
		t.Fatalf("pwrite: %v", err)
	}
	pids := []int{os.Getpid()}
	const slack = 256 // KiB: the test's own pages that move between reads
	check := func(step string, wantUnmapped uint64) {
		t.Helper()
		unmapped, err := UnmappedGuest(pids)
		if err != nil {
			t.Fatal(err)
		}
		byKind, err := Breakdown(pids)
		if err != nil {
			t.Fatal(err)
		}
		if unmapped+slack < wantUnmapped || unmapped > wantUnmapped+slack {
			t.Errorf("%s: UnmappedGuest = %d KiB, want %d", step, unmapped, wantUnmapped)
		}
		if g := byKind[KindGuest]; g < size/1024 || g > size/1024+slack {
			t.Errorf("%s: Breakdown's guest = %d KiB, want the file's %d KiB, mapped or not", step, g, size/1024)
		}
	}
	check("written, not mapped", size/1024)

	m, err := unix.Mmap(fd, 0, size/4, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	defer unix.Munmap(m)
	check("a quarter mapped", 3*size/4/1024)
}
