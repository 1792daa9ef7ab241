package sandbox

import (
	"os/exec"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
)

// TreeCPU returns the CPU time (user and system) that the processes in pids
// have used so far, each with its children that have exited and been waited
// for (pids as memstat.DescendantsOf lists them, parents before children).
// A child that exits and is reaped between the read of its parent and its
// own read is missed, its own CPU at most.
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
// tree (reparented elsewhere) or that exited and was reaped outside it.
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
