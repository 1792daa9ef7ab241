package restorelog

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A sandbox log as runsc writes it (trimmed): the boot timeline, the
// Restore timeline with a nested one, and the kernel load's statistics.
const bootLog = `I1202 00:04:06.038204       1 cli.go:275] **************** gVisor ****************
D1202 00:04:06.039235       1 timing.go:125] Timer for runsc boot: Timeline runsc boot reached midpoint Go code running at 00:04:06.037661527 (unix nanos: 1)
D1202 00:04:06.057695       1 timing.go:125] Timer for runsc boot: Timeline runsc boot reached midpoint capabilities applied at 00:04:06.057694191 (unix nanos: 1)
D1202 00:04:06.077000       1 timing.go:125] Timer for runsc boot: Timeline runsc boot reached midpoint platform created at 00:04:06.077000000 (unix nanos: 1)
D1202 00:04:06.095669       1 timing.go:125] Timer for runsc boot: Timeline runsc boot reached midpoint notifying parent at 00:04:06.095667867 (unix nanos: 1)
D1202 00:04:06.105627       1 timing.go:125] Timer for Restore: Timeline Restore reached midpoint cm.Restore RPC at 00:04:06.105619017 (unix nanos: 1)
D1202 00:04:06.126727       1 timing.go:125] Timer for Restore: Timeline Restore reached midpoint restorer initialized at 00:04:06.126725414 (unix nanos: 1)
D1202 00:04:06.143430       1 timing.go:125] Timer for Restore: Timeline Restore reached midpoint loading kernel at 00:04:06.143430000 (unix nanos: 1)
I1202 00:04:06.232842       1 kernel.go:1012] Kernel load stats: 
           total |    count |              per | type
-----------------+----------+------------------+----------------
       46.7088ms |        1 |        46.7088ms | state.default
      5.637785ms |     4015 |          1.404µs | pkg/atomicbitops.Uint32
D1202 00:04:06.233023       1 timing.go:125] Timer for Restore: Timeline Restore/kernel load reached midpoint Kernel loaded at 00:04:06.233023000 (unix nanos: 1)
D1202 00:04:06.291215       1 timing.go:125] Timer for Restore: Timeline Restore reached midpoint kernel loaded at 00:04:06.291215000 (unix nanos: 1)
D1202 00:04:06.297645       1 timing.go:246] Timer for Restore: Timeline Restore ended at 00:04:06.297626015 (unix nanos: 1)
`

func TestDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("runsc.log.1.boot.txt", bootLog)
	write("runsc.log.1.restore.txt", "I1202 00:04:05.975334   21974 cli.go:275] **************** gVisor ****************\n")
	// A sandbox that was started, not restored, is not a restore.
	write("runsc.log.0.boot.txt", "D1202 00:04:01.000000       1 timing.go:125] Timer for runsc boot: Timeline runsc boot reached midpoint Go code running at 00:04:01.0 (unix nanos: 1)\n")

	rs, err := Dir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("Dir found %d restores, want 1", len(rs))
	}
	r := rs[0]
	for _, tc := range []struct {
		phase string
		want  time.Duration
	}{
		{"runsc restore → sandbox process runs", 63901 * time.Microsecond},
		{"waiting for the Restore RPC", 9958 * time.Microsecond},
		{"kernel state load (object graph)", 89593 * time.Microsecond},
		{"memory, network stack, VFS", 58192 * time.Microsecond},
		{"start the restored tasks", 6430 * time.Microsecond},
	} {
		var got time.Duration
		var ok bool
		for _, p := range Phases {
			if p.Name == tc.phase {
				got, ok = r.Phase(p)
			}
		}
		if !ok || got != tc.want {
			t.Errorf("phase %q = %v, %v; want %v", tc.phase, got, ok, tc.want)
		}
	}
	if total, ok := r.Total(); !ok || total != 322311*time.Microsecond {
		t.Errorf("Total() = %v, %v; want 322.311ms", total, ok)
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
