// Package memstat measures the memory of runsc sandboxes honestly: Pss
// summed over every process of a sandbox (the sentry, its systrap stub
// processes and the gofer), counting each address space once.
package memstat

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Usage is the memory of a set of processes, in KiB.
type Usage struct {
	Rss, Pss, PrivateDirty uint64
}

// Add adds o to u.
func (u *Usage) Add(o Usage) {
	u.Rss += o.Rss
	u.Pss += o.Pss
	u.PrivateDirty += o.PrivateDirty
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
	out := []int{pid}
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

// Processes sums the memory of pids, counting each address space once.
func Processes(pids []int) (Usage, error) {
	var (
		total Usage
		seen  []int
	)
	for _, pid := range pids {
		dup := false
		for _, s := range seen {
			if sameAddressSpace(pid, s) {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		u, err := Rollup(pid)
		if err != nil {
			// Processes may exit while we look; ignore them.
			continue
		}
		seen = append(seen, pid)
		total.Add(u)
	}
	return total, nil
}

// Sandbox is the memory of one sandbox: all processes and the sentry alone.
type Sandbox struct {
	All, Sentry Usage
}

// OfSandbox measures the sandbox whose sentry is sentryPID and whose gofer
// is goferPID (0 if none).
func OfSandbox(sentryPID, goferPID int) (Sandbox, error) {
	sentry, err := Rollup(sentryPID)
	if err != nil {
		return Sandbox{}, fmt.Errorf("sentry %d: %w", sentryPID, err)
	}
	pids := Descendants(sentryPID)
	if goferPID > 0 {
		pids = append(pids, Descendants(goferPID)...)
	}
	all, err := Processes(pids)
	if err != nil {
		return Sandbox{}, err
	}
	return Sandbox{All: all, Sentry: sentry}, nil
}
