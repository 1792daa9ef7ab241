// Package memstat measures the memory of runsc sandboxes honestly: Pss
// summed over every process of a sandbox (the sentry, its systrap stub
// processes and the gofer), counting each address space once, plus the
// pages of the sandbox's MemoryFile that no process maps.
//
// Pss counts a page only where a process maps it. A sentry fills some pages
// of its MemoryFile (memfd "runsc-memory") with write(2)-family calls rather
// than through a mapping: upstream's restore does not, but the fork's
// shared-base restore does (a base's write set by sendfile, copy-on-write
// copies by pwrite), and until the guest touches such a page no process
// maps it. It still takes memory (shmem), so summing Pss alone would
// understate the fork's memory against upstream's. A MemoryFile belongs to
// one sandbox, so its allocation (st_blocks) is all that sandbox's:
// OfSandbox reports the part of it that no process maps beside the Pss
// (Usage.Unmapped; Usage.Total is their sum), and adds it to KindGuest in
// its memory by kind (Sandbox.ByKind). Page cache of files (base.img, upstream's pages file) that no
// process maps is not counted, for either runtime: the kernel reclaims it
// like any clean cache.
package memstat

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Usage is the memory of a set of processes, in KiB.
type Usage struct {
	// Rss, Pss and PrivateDirty are the kernel's (smaps_rollup), summed.
	Rss, Pss, PrivateDirty uint64

	// Unmapped is the part of the processes' MemoryFiles that no process
	// maps, which Pss leaves out (OfSandbox only; see the package comment).
	Unmapped uint64
}

// Add adds o to u.
func (u *Usage) Add(o Usage) {
	u.Rss += o.Rss
	u.Pss += o.Pss
	u.PrivateDirty += o.PrivateDirty
	u.Unmapped += o.Unmapped
}

// Total returns the memory the processes hold: Pss plus Unmapped.
func (u Usage) Total() uint64 {
	return u.Pss + u.Unmapped
}

// Rollup reads /proc/PID/smaps_rollup.
func Rollup(pid int) (Usage, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return Usage{}, err
	}
	defer f.Close()
	var u Usage
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) != 3 {
			continue
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "Rss:":
			u.Rss = v
		case "Pss:":
			u.Pss = v
		case "Private_Dirty:":
			u.PrivateDirty = v
		}
	}
	return u, s.Err()
}

// Descendants returns pid and all its descendants.
func Descendants(pid int) []int {
	return DescendantsOf(pid)
}

// DescendantsOf returns each of roots and all their descendants, from one
// pass over /proc. A root that is a descendant of another is listed twice.
func DescendantsOf(roots ...int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name may contain spaces; fields resume after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, err := strconv.Atoi(fields[1])
		if err != nil {
			continue
		}
		children[ppid] = append(children[ppid], p)
	}
	out := append([]int(nil), roots...)
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// sameAddressSpace reports whether two processes share one mm (kcmp
// KCMP_VM).
func sameAddressSpace(a, b int) bool {
	const kcmpVM = 1
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	return errno == 0 && r == 0
}

// eachAddressSpace calls read for each of pids whose address space no
// earlier pid shares; read returns false if the process could not be read
// (it exited meanwhile), which then does not count as seen.
func eachAddressSpace(pids []int, read func(pid int) bool) {
	var seen []int
	for _, pid := range pids {
		dup := false
		for _, s := range seen {
			if sameAddressSpace(pid, s) {
				dup = true
				break
			}
		}
		if !dup && read(pid) {
			seen = append(seen, pid)
		}
	}
}

// Processes sums the memory of pids, counting each address space once.
// Processes that exit while it reads are left out.
func Processes(pids []int) (Usage, error) {
	var total Usage
	eachAddressSpace(pids, func(pid int) bool {
		u, err := Rollup(pid)
		if err != nil {
			return false
		}
		total.Add(u)
		return true
	})
	return total, nil
}

// Sandbox is the memory of one sandbox: all processes and the sentry alone,
// and all processes' memory by kind.
type Sandbox struct {
	All, Sentry Usage

	// ByKind is the memory of all processes, in KiB, by kind (KindGuest,
	// ...): their Pss, each address space once, with the unmapped pages
	// added to KindGuest.
	ByKind map[string]uint64
}

// SandboxPIDs returns the processes of the sandbox whose sentry is
// sentryPID and whose gofer is goferPID (0 if none): both and their
// descendants (the systrap stubs).
func SandboxPIDs(sentryPID, goferPID int) []int {
	if goferPID > 0 {
		return DescendantsOf(sentryPID, goferPID)
	}
	return Descendants(sentryPID)
}

// OfSandbox measures the sandbox whose sentry is sentryPID and whose gofer
// is goferPID (0 if none), with one read of each process's smaps (measure).
// Both Usages include, as Unmapped, the sandbox's MemoryFile pages that no
// process maps: the sentry owns the file. A sentry that holds no MemoryFile
// is an error (nothing would be counted).
func OfSandbox(sentryPID, goferPID int) (Sandbox, error) {
	sb, files, err := measure(sentryPID, SandboxPIDs(sentryPID, goferPID))
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox of sentry %d: %w", sentryPID, err)
	}
	if files == 0 {
		return Sandbox{}, fmt.Errorf("sentry %d holds no MemoryFile (an fd on %s)", sentryPID, guestFilePrefix)
	}
	return sb, nil
}

// guestFilePrefix is how /proc names a sentry's main MemoryFile, in
// /proc/PID/fd links and in smaps.
const guestFilePrefix = "/memfd:runsc-memory"

// guestAllocatedKiB returns the KiB allocated to the distinct MemoryFiles
// (memfd "runsc-memory") that pids hold open, each file once, and how many
// such files there are. A process that exits, or an fd closed, while it
// reads is left out.
func guestAllocatedKiB(pids []int) (kib uint64, files int, err error) {
	gone := func(err error) bool { return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) }
	type fileID struct{ dev, ino uint64 }
	seen := map[fileID]bool{}
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		entries, err := os.ReadDir(dir)
		if gone(err) {
			continue
		} else if err != nil {
			return 0, 0, err
		}
		for _, e := range entries {
			fd := filepath.Join(dir, e.Name())
			link, err := os.Readlink(fd)
			if gone(err) {
				continue
			} else if err != nil {
				return 0, 0, err
			}
			if !strings.HasPrefix(link, guestFilePrefix) {
				continue
			}
			var st unix.Stat_t
			if err := unix.Stat(fd, &st); gone(err) {
				continue
			} else if err != nil {
				return 0, 0, fmt.Errorf("stat %s: %w", fd, err)
			}
			id := fileID{uint64(st.Dev), st.Ino}
			if seen[id] {
				continue
			}
			seen[id] = true
			kib += uint64(st.Blocks) * 512 / 1024
		}
	}
	return kib, len(seen), nil
}

// measure returns the memory of pids (one sandbox's processes, sentryPID
// among them) from one read of each address space's smaps: All and Sentry,
// and All by kind, each with the KiB of the sandbox's MemoryFiles that no
// process maps (those files' allocation less the Pss of their mapped
// pages, which only that sandbox's processes map: see the package comment)
// as Unmapped and in KindGuest; and how many MemoryFiles pids hold. The
// allocation is read first: a page allocated and mapped between the two
// reads then counts once, as mapped; one allocated after both is not
// counted. Processes that exit while it reads are left out, except the
// sentry.
func measure(sentryPID int, pids []int) (sb Sandbox, files int, err error) {
	alloc, files, err := guestAllocatedKiB(pids)
	if err != nil {
		return Sandbox{}, 0, err
	}
	sb.ByKind = map[string]uint64{}
	sentrySeen := false
	var parseErr error
	eachAddressSpace(pids, func(pid int) bool {
		f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
		if err != nil {
			return false
		}
		defer f.Close()
		perPID := map[string]uint64{}
		u, err := parseSmaps(bufio.NewScanner(f), perPID)
		if err != nil {
			if _, statErr := os.Stat(fmt.Sprintf("/proc/%d", pid)); statErr != nil {
				return false // it exited while we read
			}
			if parseErr == nil {
				parseErr = fmt.Errorf("/proc/%d/smaps: %w", pid, err)
			}
			return false
		}
		sb.All.Add(u)
		for k, v := range perPID {
			sb.ByKind[k] += v
		}
		if pid == sentryPID {
			sb.Sentry, sentrySeen = u, true
		}
		return true
	})
	if parseErr != nil {
		return Sandbox{}, 0, parseErr
	}
	if !sentrySeen {
		return Sandbox{}, 0, fmt.Errorf("sentry %d: its smaps could not be read (it exited?)", sentryPID)
	}
	unmapped := alloc - min(alloc, sb.ByKind[KindGuest])
	sb.ByKind[KindGuest] += unmapped
	sb.All.Unmapped, sb.Sentry.Unmapped = unmapped, unmapped
	return sb, files, nil
}

// Kinds of memory that Sandbox.ByKind tells apart, by what a mapping maps.
const (
	// KindGuest is the sentry's main MemoryFile (memfd "runsc-memory"):
	// the guest's private pages, mapped by the sentry and the stubs, and
	// (in Sandbox.ByKind) the pages of it that no process maps.
	KindGuest = "guest"
	// KindBase is a shared base (a file named base.img), mapped read-only
	// by the sentry and the stubs of every clone over it.
	KindBase = "base"
	// KindPlatform is systrap's own memory file (memfd "systrap-memory").
	KindPlatform = "platform"
	// KindAnon is anonymous memory: the Go heap, stacks, [heap].
	KindAnon = "anon"
	// KindFile is any other file mapping (binaries, libraries).
	KindFile = "file"
)

// mappingKind classifies a mapping by the pathname field of its smaps header.
func mappingKind(path string) string {
	switch {
	case path == "" || strings.HasPrefix(path, "[") && path != "[vdso]" && path != "[vvar]" && path != "[vsyscall]":
		return KindAnon
	case strings.HasPrefix(path, guestFilePrefix):
		return KindGuest
	case strings.HasPrefix(path, "/memfd:systrap-memory"):
		return KindPlatform
	case strings.HasPrefix(path, "/memfd:"):
		return KindAnon
	case filepath.Base(strings.TrimSuffix(path, " (deleted)")) == "base.img":
		return KindBase
	default:
		return KindFile
	}
}

// parseSmaps adds the Pss, in KiB, of every mapping in the /proc/PID/smaps
// text s to byKind, keyed by mappingKind, and returns the Rss, Pss and
// Private_Dirty of all mappings (smaps_rollup's, from the same read).
func parseSmaps(s *bufio.Scanner, byKind map[string]uint64) (Usage, error) {
	var u Usage
	kind := ""
	for s.Scan() {
		line := s.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		// A mapping's header starts with its address range; its
		// attributes are "Name: value [kB]".
		if !strings.HasSuffix(fields[0], ":") {
			if len(fields) < 5 {
				return Usage{}, fmt.Errorf("malformed smaps header %q", line)
			}
			path := ""
			if len(fields) > 5 {
				// The pathname may contain spaces.
				path = strings.Join(fields[5:], " ")
			}
			kind = mappingKind(path)
			continue
		}
		var sum *uint64
		switch fields[0] {
		case "Rss:":
			sum = &u.Rss
		case "Pss:":
			sum = &u.Pss
		case "Private_Dirty:":
			sum = &u.PrivateDirty
		}
		if sum == nil || len(fields) < 2 {
			continue
		}
		if kind == "" {
			return Usage{}, fmt.Errorf("smaps attribute %q before any mapping", line)
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("smaps line %q: %w", line, err)
		}
		*sum += v
		if fields[0] == "Pss:" {
			byKind[kind] += v
		}
	}
	return u, s.Err()
}
