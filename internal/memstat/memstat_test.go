package memstat

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
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
	u, err := parseSmaps(bufio.NewScanner(strings.NewReader(smaps)), got)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{KindFile: 500, KindGuest: 4096, KindBase: 100, KindAnon: 80}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseSmaps = %v, want %v", got, want)
	}
	if wantU := (Usage{Rss: 1000, Pss: 4776}); u != wantU {
		t.Errorf("parseSmaps's usage = %+v, want %+v", u, wantU)
	}
	for _, bad := range []string{"Pss: 4 kB\n", "00400000-00c00000 r-xp\n", "00400000-00c00000 r-xp 0 08:01 1 /x\nPss: x kB\n"} {
		if _, err := parseSmaps(bufio.NewScanner(strings.NewReader(bad)), map[string]uint64{}); err == nil {
			t.Errorf("parseSmaps(%q) succeeded, want an error", bad)
		}
	}
}

// TestMeasureMatchesRollup checks measure against the kernel's own sum for
// this process: the kinds add up to the Pss it reports from the same read,
// and that Pss to smaps_rollup's.
func TestMeasureMatchesRollup(t *testing.T) {
	pid := os.Getpid()
	sb, _, err := measure(pid, []int{pid, pid})
	if err != nil {
		t.Fatal(err)
	}
	roll, err := Rollup(pid)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, v := range sb.ByKind {
		sum += v
	}
	if sum != sb.All.Total() || sb.Sentry != sb.All {
		t.Errorf("measure's kinds sum to %d KiB, its total is %d KiB (sentry %+v, all %+v): want one snapshot", sum, sb.All.Total(), sb.Sentry, sb.All)
	}
	// The two reads are moments apart; allow this process's heap to move.
	if diff := int64(sum) - int64(roll.Pss); diff > 2048 || diff < -2048 {
		t.Errorf("measure's kinds sum to %d KiB, smaps_rollup says %d KiB", sum, roll.Pss)
	}
	if sb.ByKind[KindAnon] == 0 || sb.ByKind[KindFile] == 0 {
		t.Errorf("measure's kinds = %v: want anonymous memory and this test binary's text", sb.ByKind)
	}
}

// TestUnmappedGuest checks that a MemoryFile's pages count whether or not a
// process maps them: pages written with pwrite (as the fork's restore fills
// a write set) are in OfSandbox's KindGuest and Unmapped
// until they are mapped, then in Pss, never twice, and a file held through
// two descriptors (or listed under two pids) counts once.
func TestUnmappedGuest(t *testing.T) {
	fd, err := unix.MemfdCreate("runsc-memory", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatalf("dup: %v", err)
	}
	defer unix.Close(dup)
	const size = 4 << 20
	if _, err := unix.Pwrite(fd, bytes.Repeat([]byte{1}, size), 0); err != nil {
		t.Fatalf("pwrite: %v", err)
	}
	pid := os.Getpid()
	check := func(step string, wantUnmapped uint64) {
		t.Helper()
		m, files, err := measure(pid, []int{pid, pid})
		if err != nil {
			t.Fatal(err)
		}
		// Only this memfd is KindGuest here: the numbers are exact.
		if unmapped := m.All.Unmapped; unmapped != wantUnmapped || files != 1 {
			t.Errorf("%s: measure's unmapped = %d KiB in %d files, want %d in one", step, unmapped, files, wantUnmapped)
		}
		sb, err := OfSandbox(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		if g := sb.ByKind[KindGuest]; g != size/1024 {
			t.Errorf("%s: OfSandbox's guest = %d KiB, want the file's %d KiB, mapped or not", step, g, size/1024)
		}
		if sb.All.Unmapped != wantUnmapped || sb.Sentry.Unmapped != wantUnmapped {
			t.Errorf("%s: OfSandbox's Unmapped = %d (all), %d (sentry) KiB, want %d", step, sb.All.Unmapped, sb.Sentry.Unmapped, wantUnmapped)
		}
		if sb.All.Total() != sb.All.Pss+wantUnmapped {
			t.Errorf("%s: Total() = %d, want Pss %d + %d", step, sb.All.Total(), sb.All.Pss, wantUnmapped)
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

// TestOfSandboxWithoutMemoryFile checks that measuring a "sandbox" whose
// sentry holds no MemoryFile fails rather than counting nothing for it.
func TestOfSandboxWithoutMemoryFile(t *testing.T) {
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if _, err := OfSandbox(cmd.Process.Pid, 0); err == nil || !strings.Contains(err.Error(), "holds no MemoryFile") {
		t.Errorf("OfSandbox of a process without a MemoryFile: %v, want an error naming the missing MemoryFile", err)
	}
}
