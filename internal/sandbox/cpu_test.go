package sandbox

import (
	"os/exec"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
)

// TestTreeCPUCountsReapedChildren checks ReadProcStat's ReapedCPU and
// TreeCPU with a shell whose child (dd) burns CPU and exits: while dd runs,
// the shell has reaped nothing and the tree's CPU includes dd's; once dd is
// gone, the shell's ReapedCPU holds what dd used (at least its last
// reading, and not much more). It also checks CommandCPU.
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
	dd := 0
	var ddLast time.Duration
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("dd (PID %d) still runs, or never ran, after 60 s", dd)
		}
		pids := memstat.Descendants(shell)
		if dd == 0 && len(pids) == 2 {
			dd = pids[1]
		}
		if dd == 0 {
			continue // dd not started yet
		}
		ddSt, err := ReadProcStat(dd)
		if err == nil && ddSt.Alive() {
			st, err := ReadProcStat(shell)
			if err != nil {
				t.Fatal(err)
			}
			if st.ReapedCPU != 0 {
				t.Fatalf("ReapedCPU = %v while the shell's only child still runs, want 0", st.ReapedCPU)
			}
			ddLast = ddSt.CPU
			if tree := TreeCPU(pids); tree < ddLast {
				t.Fatalf("TreeCPU = %v, less than its running child's %v", tree, ddLast)
			}
			continue
		}
		// dd has exited; once the shell has reaped it, it execs sleep.
		st, err := ReadProcStat(shell)
		if err != nil {
			t.Fatal(err)
		}
		if len(memstat.Descendants(shell)) != 1 {
			continue // dd is a zombie, not reaped yet
		}
		const slack = 2*time.Second/clockTicksPerSecond + 200*time.Millisecond
		if st.ReapedCPU < ddLast || st.ReapedCPU > ddLast+slack {
			t.Errorf("ReapedCPU = %v after dd was reaped, want at least dd's last reading, %v, and at most %v more", st.ReapedCPU, ddLast, slack)
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
