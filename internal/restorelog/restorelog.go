// Package restorelog reads the phases of a `runsc restore` from runsc's
// debug logs (--debug --debug-log=DIR/): the timeline that runsc's timing
// package logs in the sandbox ("Timer for runsc boot", "Timer for Restore"),
// the kernel load's statistics by object type ("Kernel load stats"), and
// the start of the `runsc restore` command itself. It reads what upstream
// runsc logs as well as forkvisor's, so both are measured the same way.
package restorelog

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Phase is one phase of a restore: the time from the milestone From to the
// milestone To, both as the sandbox logged them.
type Phase struct {
	Name     string
	From, To string // milestones: a timeline midpoint, or StartMilestone/EndMilestone
}

// Milestones that are not timeline midpoints.
const (
	// StartMilestone is the first line of the `runsc restore` command's log.
	StartMilestone = "runsc restore started"
	// EndMilestone is the end of the sandbox's Restore timeline: the
	// restored tasks have been started.
	EndMilestone = "Restore ended"
)

// Phases are the phases of a restore in order, each from the end of the one
// before; their lengths add up to the restore's total.
var Phases = []Phase{
	{"runsc restore → sandbox process runs", StartMilestone, "Go code running"},
	{"chroot, capabilities", "Go code running", "capabilities applied"},
	{"platform (systrap stubs)", "capabilities applied", "platform created"},
	{"kernel, network, control server", "platform created", "notifying parent"},
	{"waiting for the Restore RPC", "notifying parent", "cm.Restore RPC"},
	{"open the image, memory file", "cm.Restore RPC", "restorer initialized"},
	{"until the kernel load starts", "restorer initialized", "loading kernel"},
	{"kernel state load (object graph)", "loading kernel", "Kernel loaded"},
	{"memory, network stack, VFS", "Kernel loaded", "kernel loaded"},
	{"start the restored tasks", "kernel loaded", EndMilestone},
}

// Milestones of the `runsc restore` command's own log, for a restore that
// creates its sandbox (read from its log lines, whose times are when they
// were written).
const (
	// CgroupJoinStarted is runsc's first "Joining cgroup" line: it moves
	// itself into the container's cgroup to start the gofer and sandbox
	// there (cgroup v1, or v2 without CLONE_INTO_CGROUP).
	CgroupJoinStarted = "runsc: joining cgroup"
	// CgroupJoined is the first line after the join's that is not the
	// cgroup package's.
	CgroupJoined = "runsc: cgroup joined"
	// SandboxStarted is runsc's "Sandbox started" line.
	SandboxStarted = "runsc: sandbox started"
	// ContainerCreated is runsc restore's "Restore: IMAGE" line, logged
	// once the container is created, just before the Restore RPC.
	ContainerCreated = "runsc: container created"
)

// Steps are costs within the phases that every image pays, from milestones
// of either log; unlike Phases they do not add up to anything.
var Steps = []Phase{
	{"runsc's move into the container's cgroup", CgroupJoinStarted, CgroupJoined},
	{"sandbox started → container created (runsc)", SandboxStarted, ContainerCreated},
	{"CPUID (cpuid.Initialize, sandbox)", "boot subcommand dispatched", "CPUID initialized"},
	// Mostly one stop-the-world AllThreadsSyscall per capability up to
	// cap_last_cap that the sandbox does not keep (with CAP_SETPCAP): its
	// length depends on how soon every thread gets a CPU.
	{"capability bounding set trimmed (sandbox)", "current capabilities read", "bounding set trimmed on all threads"},
	{"seccheck.Initialize (sandbox)", "resolved mounts read", "seccheck initialized"},
	// A precompiled seccomp program looked up and rendered, on the start's
	// or restore's path (the lookup built the table of all of them before
	// patch 0044 moved that to while the sandbox waits).
	{"seccomp program looked up, rendered (sandbox)", "pre-seccomp callback done", "precompiled seccomp program rendered"},
	{"page tables of restored memory (sandbox)", "MFs loaded", "restored memory populated"},
}

// Restore is what one sandbox's logs say of its restore.
type Restore struct {
	// BootLog is the sandbox's log file.
	BootLog string
	// At maps each milestone to when it was logged.
	At map[string]time.Time
	// LoadStats are the kernel load's most expensive object types, as
	// logged ("Kernel load stats"), most expensive first.
	LoadStats []TypeStat
}

// TypeStat is the time the kernel load spent on objects of one type.
type TypeStat struct {
	Type  string
	Total time.Duration
	Count int
}

// Phase returns the length of p in r, or false if r lacks a milestone.
func (r *Restore) Phase(p Phase) (time.Duration, bool) {
	from, ok1 := r.At[p.From]
	to, ok2 := r.At[p.To]
	if !ok1 || !ok2 {
		return 0, false
	}
	return to.Sub(from), true
}

// Total returns the time from StartMilestone to EndMilestone.
func (r *Restore) Total() (time.Duration, bool) {
	return r.Phase(Phase{From: StartMilestone, To: EndMilestone})
}

// glog's line header: level, MMDD, time.
var lineHeader = regexp.MustCompile(`^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} `)

// A timeline midpoint and the Restore timeline's end, each with the time it
// happened (which can be milliseconds before its line was logged), and a
// row of the kernel load's statistics.
var (
	midpoint = regexp.MustCompile(`Timeline .+? reached midpoint (.+) at \S+ \(unix nanos: (\d+)\)`)
	ended    = regexp.MustCompile(`Timeline Restore ended at \S+ \(unix nanos: (\d+)\)`)
	statLine = regexp.MustCompile(`^\s*(\S+) \|\s+(\d+) \|\s+\S+ \| (\S+)$`)
)

// logNameTime matches the time in the name runsc gives a debug log
// (runsc.log.20261202-000405.972870.restore.txt): when the command started,
// in local time (restorephases must run in runsc's time zone), to the
// granularity of the clock runsc reads it from (a few milliseconds).
var logNameTime = regexp.MustCompile(`\.(\d{8}-\d{6}\.\d{6})\.[a-z]+\.txt$`)

// unixNanos parses a decimal count of nanoseconds since the epoch.
func unixNanos(s string) (time.Time, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, n), nil
}

// Dir reads every restore logged in dir: each sandbox log (*.boot.txt) with
// a Restore timeline, with the `runsc restore` log of the same run
// (*.restore.txt, same name before the suffix).
func Dir(dir string) ([]*Restore, error) {
	boots, err := filepath.Glob(filepath.Join(dir, "*.boot.txt"))
	if err != nil {
		return nil, err
	}
	sort.Strings(boots)
	var rs []*Restore
	for _, b := range boots {
		r, err := readBoot(b)
		if err != nil {
			return nil, err
		}
		if r == nil {
			continue // a sandbox that was started, not restored
		}
		// The restore command's log has the same name but for its suffix;
		// the name says when the command started.
		cmd := strings.TrimSuffix(b, ".boot.txt") + ".restore.txt"
		if _, err := os.Stat(cmd); err == nil {
			if m := logNameTime.FindStringSubmatch(cmd); m != nil {
				if t, err := time.ParseInLocation("20060102-150405.000000", m[1], time.Local); err == nil {
					r.At[StartMilestone] = t
					if err := readCommand(cmd, t, r.At); err != nil {
						return nil, err
					}
				}
			}
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// commandLine matches a line of the restore command's log: its time, and
// what the command milestones need of the rest.
var commandLine = regexp.MustCompile(`^[DIWEF](\d{4} \d\d:\d\d:\d\d\.\d{6}) +\d+ (\S+):\d+\] (.*)$`)

// readCommand adds to at the milestones of the restore command's log at
// path (CgroupJoinStarted and the others), each the first time it happens.
// The log's lines carry no year: it is start's, the time the command
// started, moved to the next year for a line dated before start's day (a
// run across New Year's Eve).
func readCommand(path string, start time.Time, at map[string]time.Time) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	set := func(name string, t time.Time) {
		if _, seen := at[name]; !seen {
			at[name] = t
		}
	}
	joining := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := commandLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		t, err := time.ParseInLocation("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s", start.Year(), m[1]), start.Location())
		if err != nil {
			return fmt.Errorf("%s: %q: %w", path, sc.Text(), err)
		}
		if t.Before(start.Truncate(24 * time.Hour)) {
			t = t.AddDate(1, 0, 0)
		}
		file, msg := m[2], m[3]
		switch {
		case strings.HasPrefix(msg, "Joining cgroup "):
			if _, seen := at[CgroupJoinStarted]; !seen {
				joining = true
			}
			set(CgroupJoinStarted, t)
		case joining && file != "cgroup.go":
			joining = false
			set(CgroupJoined, t)
		}
		switch {
		case strings.HasPrefix(msg, "Sandbox started, PID"):
			set(SandboxStarted, t)
		case file == "restore.go" && strings.HasPrefix(msg, "Restore: "):
			set(ContainerCreated, t)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// readBoot reads a sandbox's log, or returns nil if it holds no restore.
func readBoot(path string) (*Restore, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &Restore{BootLog: path, At: map[string]time.Time{}}
	inStats := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if inStats {
			if m := statLine.FindStringSubmatch(line); m != nil && m[3] != "[all]" {
				d, err1 := time.ParseDuration(m[1])
				n, err2 := strconv.Atoi(m[2])
				if err1 == nil && err2 == nil {
					r.LoadStats = append(r.LoadStats, TypeStat{Type: m[3], Total: d, Count: n})
				}
				continue
			}
			if statLine.MatchString(line) || strings.HasPrefix(strings.TrimSpace(line), "total |") || strings.HasPrefix(line, "---") || strings.TrimSpace(line) == "" {
				continue
			}
			inStats = false
		}
		if !lineHeader.MatchString(line) {
			continue
		}
		if strings.Contains(line, "Kernel load stats:") {
			inStats = true
			continue
		}
		name, nanos := "", ""
		if m := ended.FindStringSubmatch(line); m != nil {
			name, nanos = EndMilestone, m[1]
		} else if m := midpoint.FindStringSubmatch(line); m != nil {
			name, nanos = m[1], m[2]
		} else {
			continue
		}
		t, err := unixNanos(nanos)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		// A midpoint's first occurrence counts (timelines share a few
		// names, e.g. "systrap memory file created"; Phases uses none of
		// those).
		if _, seen := r.At[name]; !seen {
			r.At[name] = t
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if _, ok := r.At["cm.Restore RPC"]; !ok {
		return nil, nil
	}
	return r, nil
}
