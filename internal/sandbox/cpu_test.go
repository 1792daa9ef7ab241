package sandbox

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
)

func TestParseHostBusyCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		wantErr    bool
	}{
		{
			name: "user nice system irq softirq count, idle iowait steal do not",
			stat: "cpu  100 20 30 5000 700 4 6 900 0 0\ncpu0 50 10 15 2500 350 2 3 450 0 0\nintr 1\n",
			want: 160 * 10 * time.Millisecond,
		},
		{
			name: "an old kernel without steal and guest",
			stat: "cpu  1 2 3 4 5 6 7\n",
			want: 19 * 10 * time.Millisecond,
		},
		{name: "no aggregate line", stat: "cpu0 1 2 3 4 5 6 7\n", wantErr: true},
		{name: "too few fields", stat: "cpu  1 2 3\n", wantErr: true},
		{name: "not a number", stat: "cpu  1 x 3 4 5 6 7\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseHostBusyCPU(strings.NewReader(tc.stat))
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseHostBusyCPU: %v, want an error: %t", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("parseHostBusyCPU = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHostBusyCPUGrows(t *testing.T) {
	before, err := HostBusyCPU()
	if err != nil {
		t.Fatal(err)
	}
	// Spin for 200 ms: at least one clock tick of busy time must show.
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := HostBusyCPU()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 100*time.Millisecond {
		t.Errorf("busy CPU grew by %v over 200 ms of spinning, want at least 100 ms", after-before)
	}
}

// TestTreeCPUCountsReapedChildren checks ReadProcStat's ReapedCPU and
// TreeCPU with a shell whose child (dd) burns CPU and exits: while dd runs,
// the shell has reaped nothing and the tree's CPU includes dd's; once the
// shell has reaped it, ReapedCPU holds what dd used (within two clock ticks
// of its last reading), and the tree's CPU does not count it twice. It also
// checks CommandCPU.
func TestTreeCPUCountsReapedChildren(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "dd if=/dev/zero of=/dev/null bs=1M count=40000 2>/dev/null; exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	shell := cmd.Process.Pid
	var ddLast, treeLast time.Duration
	sawDD := false
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the shell did not reap dd within 30 s (saw dd running: %t)", sawDD)
		}
		pids := memstat.Descendants(shell)
		st, err := ReadProcStat(shell)
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 2 {
			dd, err := ReadProcStat(pids[1])
			if err != nil || !dd.Alive() {
				continue // exiting: read again
			}
			if st.ReapedCPU != 0 {
				t.Fatalf("ReapedCPU = %v while the shell's only child still runs, want 0", st.ReapedCPU)
			}
			sawDD = true
			ddLast = dd.CPU
			treeLast = TreeCPU(pids)
			if treeLast < ddLast {
				t.Fatalf("TreeCPU = %v, less than its running child's %v", treeLast, ddLast)
			}
			continue
		}
		if st.ReapedCPU == 0 {
			continue // dd not started yet, or not reaped yet
		}
		if !sawDD {
			t.Fatalf("dd ended before it was seen running")
		}
		const slack = 2 * time.Second / clockTicksPerSecond
		if st.ReapedCPU < ddLast || st.ReapedCPU > ddLast+slack+200*time.Millisecond {
			t.Errorf("ReapedCPU = %v after dd was reaped, want about dd's last reading, %v", st.ReapedCPU, ddLast)
		}
		if tree := TreeCPU(pids); tree > st.CPU+st.ReapedCPU+slack {
			t.Errorf("TreeCPU = %v, more than the shell's own and reaped CPU (%v): counted twice?", tree, st.CPU+st.ReapedCPU)
		}
		break
	}

	sh := exec.Command("/bin/sh", "-c", "dd if=/dev/zero of=/dev/null bs=1M count=16000 2>/dev/null")
	if CommandCPU(sh) != 0 {
		t.Errorf("CommandCPU of a command not run is not 0")
	}
	if err := sh.Run(); err != nil {
		t.Fatal(err)
	}
	if CommandCPU(sh) < 10*time.Millisecond {
		t.Errorf("CommandCPU = %v for a shell whose dd copied 16000 MiB, want at least 10 ms", CommandCPU(sh))
	}
}
