package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
)

// HostBusyCPU returns the CPU time that the host's CPUs together have spent
// busy since boot, from /proc/stat: user, nice, system, irq and softirq time
// (guest time is within user and nice). Idle, I/O wait and steal (time the
// hypervisor gave to others) are not busy. The difference of two readings
// is what every process and kernel thread used in between, whoever started
// it: the CPU cost of work that spreads over many processes (runsc commands,
// sandboxes, gofers, stubs, the kernel's own work on their behalf).
func HostBusyCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	d, err := parseHostBusyCPU(bytes.NewReader(b))
	if err != nil {
		return 0, fmt.Errorf("/proc/stat: %w", err)
	}
	return d, nil
}

// parseHostBusyCPU reads the aggregate "cpu" line of /proc/stat from r.
func parseHostBusyCPU(r io.Reader) (time.Duration, error) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		// user nice system idle iowait irq softirq [steal guest guest_nice]
		if len(f) < 8 {
			return 0, fmt.Errorf("the cpu line has %d fields, want at least 8: %q", len(f), s.Text())
		}
		var busy int64
		for _, idx := range []int{1, 2, 3, 6, 7} {
			n, err := strconv.ParseInt(f[idx], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("the cpu line: %w", err)
			}
			busy += n
		}
		return time.Duration(busy) * (time.Second / clockTicksPerSecond), nil
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no aggregate cpu line")
}

// TreeCPU returns the CPU time (user and system) that the processes in pids
// have used so far, each with its children that have exited and been waited
// for (pids as memstat.DescendantsOf lists them). Between the reads of two
// processes, a child may exit and be reaped by its parent: it is then
// missed, or counted twice, its own CPU at most.
func TreeCPU(pids []int) time.Duration {
	var total time.Duration
	for _, p := range pids {
		if st, err := ReadProcStat(p); err == nil {
			total += st.CPU + st.ReapedCPU
		}
	}
	return total
}

// SandboxTreeCPU returns the CPU time that the processes of container id's
// sandbox have used so far: TreeCPU of its sentry, its gofer and their
// descendants (the systrap stubs, helpers such as the /proc umounter once
// reaped), found in one pass over /proc (memstat.SandboxPIDs). runsc
// commands are not in it (see CommandCPU), nor a process that has left the
// tree (reparented elsewhere) or exited unreaped.
func (r *Runsc) SandboxTreeCPU(id string) (time.Duration, error) {
	pid, err := r.SandboxPID(id)
	if err != nil {
		return 0, err
	}
	return TreeCPU(memstat.SandboxPIDs(pid, r.GoferPID(id))), nil
}

// CommandCPU returns the CPU time (user and system) that an exited command
// and the children it waited for used, or 0 if it has not exited.
func CommandCPU(cmd *exec.Cmd) time.Duration {
	if cmd.ProcessState == nil {
		return 0
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}
