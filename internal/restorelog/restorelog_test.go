package restorelog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// logLine formats a timeline line as runsc's timing package logs it: the
// line is written lag after the milestone happened at.
func logLine(timeline, name string, at time.Time, lag time.Duration) string {
	logged := at.Add(lag)
	verb := "reached midpoint " + name
	if name == EndMilestone {
		verb = "ended"
	}
	return fmt.Sprintf("D%s       1 timing.go:125] Timer for %s: Timeline %s %s at %s (unix nanos: %d)\n",
		logged.Format("0102 15:04:05.000000"), timeline, timeline, verb, at.Format("15:04:05.000000000"), at.UnixNano())
}

func TestDir(t *testing.T) {
	// The restore command starts at start (its log's name says so); each
	// milestone happens at its offset and is logged 2 ms later, across
	// midnight.
	start := time.Date(2026, 12, 1, 23, 59, 59, 950000000, time.Local)
	milestones := []struct {
		timeline, name string
		at             time.Duration
	}{
		{"runsc boot", "Go code running", 40 * time.Millisecond},
		{"runsc boot", "current capabilities read", 45 * time.Millisecond},
		{"runsc boot", "bounding set trimmed on all threads", 57 * time.Millisecond},
		{"runsc boot", "capabilities applied", 60 * time.Millisecond},
		{"runsc boot", "platform created", 80 * time.Millisecond},
		{"runsc boot", "notifying parent", 85 * time.Millisecond},
		{"Restore", "cm.Restore RPC", 100 * time.Millisecond},
		{"Restore", "restorer initialized", 110 * time.Millisecond},
		{"Restore", "loading kernel", 120 * time.Millisecond},
		{"Restore/kernel load", "Kernel loaded", 200 * time.Millisecond},
		{"Restore", "kernel loaded", 210 * time.Millisecond},
		{"Restore", EndMilestone, 230 * time.Millisecond},
	}
	var boot strings.Builder
	for _, m := range milestones {
		boot.WriteString(logLine(m.timeline, m.name, start.Add(m.at), 2*time.Millisecond))
		if m.name == "loading kernel" {
			boot.WriteString("I1202 00:00:00.150000       1 kernel.go:1012] Kernel load stats: \n" +
				"           total |    count |              per | type\n" +
				"-----------------+----------+------------------+----------------\n" +
				"       46.7088ms |        1 |        46.7088ms | state.default\n" +
				"      5.637785ms |     4015 |          1.404µs | pkg/atomicbitops.Uint32\n" +
				"-----------------+----------+------------------+----------------\n" +
				"     65.689587ms |    15787 |           4.16µs | [all]\n")
		}
	}
	// A midpoint logged again later does not move it.
	boot.WriteString(logLine("Restore", "loading kernel", start.Add(time.Second), 0))

	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stamp := start.Format("20060102-150405.000000")
	write("runsc.log."+stamp+".boot.txt", boot.String())
	// The command's own lines, across midnight: the join (two cgroup.go
	// lines, then the first line of another file), the sandbox's start and
	// the container's creation.
	write("runsc.log."+stamp+".restore.txt", "I1201 23:59:59.951000   21974 cli.go:275] **************** gVisor ****************\n"+
		"D1201 23:59:59.955000   21974 cgroup.go:721] Joining cgroup \"/sys/fs/cgroup/cpu/c\"\n"+
		"D1201 23:59:59.955010   21974 cgroup.go:163] Setting \"/sys/fs/cgroup/cpu/c/cgroup.procs\" to \"0\"\n"+
		"D1201 23:59:59.967000   21974 cgroup.go:721] Joining cgroup \"/sys/fs/cgroup/memory/c\"\n"+
		"I1202 00:00:00.001000   21974 namespace.go:201] Mapping host uid 0 to container uid 0 (size=4294967295)\n"+
		"I1202 00:00:00.005000   21974 sandbox.go:1480] Sandbox started, PID: 21990\n"+
		"D1202 00:00:00.040000   21974 restore.go:256] Restore: /tmp/image\n"+
		"D1202 00:00:00.090000   21974 restore.go:256] Restore: /tmp/image\n")
	// A sandbox that was started, not restored, is not a restore.
	write("runsc.log.20261201-235900.000000.boot.txt", logLine("runsc boot", "Go code running", start.Add(-time.Minute), 0))

	rs, err := Dir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("Dir found %d restores, want 1", len(rs))
	}
	r := rs[0]
	for _, tc := range []struct {
		in   []Phase
		name string
		want time.Duration
	}{
		{Phases, "runsc restore → sandbox process runs", 40 * time.Millisecond},
		{Phases, "waiting for the Restore RPC", 15 * time.Millisecond},
		{Phases, "kernel state load (object graph)", 80 * time.Millisecond},
		{Phases, "memory, network stack, VFS", 10 * time.Millisecond},
		{Phases, "start the restored tasks", 20 * time.Millisecond},
		{Steps, "runsc's move into the container's cgroup", 46 * time.Millisecond},
		{Steps, "sandbox started → container created (runsc)", 35 * time.Millisecond},
		{Steps, "capability bounding set trimmed (sandbox)", 12 * time.Millisecond},
	} {
		var got time.Duration
		var ok bool
		for _, p := range tc.in {
			if p.Name == tc.name {
				got, ok = r.Phase(p)
			}
		}
		if !ok || got != tc.want {
			t.Errorf("%q = %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
	if total, ok := r.Total(); !ok || total != 230*time.Millisecond {
		t.Errorf("Total() = %v, %v; want 230ms", total, ok)
	}
	// The phases cover the restore without gaps or overlaps.
	var sum time.Duration
	for _, p := range Phases {
		d, _ := r.Phase(p)
		sum += d
	}
	if total, _ := r.Total(); sum != total {
		t.Errorf("phases add up to %v, total is %v", sum, total)
	}
	want := []TypeStat{{"state.default", 46708800 * time.Nanosecond, 1}, {"pkg/atomicbitops.Uint32", 5637785 * time.Nanosecond, 4015}}
	if len(r.LoadStats) != len(want) || r.LoadStats[0] != want[0] || r.LoadStats[1] != want[1] {
		t.Errorf("LoadStats = %+v, want %+v", r.LoadStats, want)
	}
}

func TestPhasesAreContiguous(t *testing.T) {
	if Phases[0].From != StartMilestone || Phases[len(Phases)-1].To != EndMilestone {
		t.Errorf("phases run from %q to %q, want %q to %q", Phases[0].From, Phases[len(Phases)-1].To, StartMilestone, EndMilestone)
	}
	for i := 1; i < len(Phases); i++ {
		if Phases[i].From != Phases[i-1].To {
			t.Errorf("phase %q starts at %q, the one before ends at %q", Phases[i].Name, Phases[i].From, Phases[i-1].To)
		}
	}
}
