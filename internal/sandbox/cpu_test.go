package sandbox

import (
	"os/exec"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
)

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
