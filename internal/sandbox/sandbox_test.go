package sandbox

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestProcessCPU(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU for 300 ms of wall time on one thread.
	x := 0
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
		for i := 0; i < 1000; i++ {
			x += i
		}
	}
	after, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// The loop may be descheduled on a busy machine; it still gets more
	// than a third of its wall time.
	if got := after - before; got < 100*time.Millisecond || got > 10*time.Second {
		t.Errorf("CPU time of a 300 ms busy loop = %v (x=%d)", got, x)
	}
	if _, err := ProcessCPU(1 << 30); err == nil {
		t.Error("ProcessCPU of a PID that does not exist: no error")
	}
}

func TestReadProcStatFaults(t *testing.T) {
	before, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Touch 16 MiB of fresh anonymous memory, without huge pages: a minor
	// fault per page (a sixteenth of them leaves room for fault-around).
	b, err := unix.Mmap(-1, 0, 16<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	if err := unix.Madvise(b, unix.MADV_NOHUGEPAGE); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(b); i += os.Getpagesize() {
		b[i] = 1
	}
	after, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after.MinorFaults - before.MinorFaults; got < 16<<20/int64(os.Getpagesize())/16 {
		t.Errorf("touching 16 MiB of new memory counted %d minor faults", got)
	}
	if after.UserCPU > after.CPU || after.CPU < before.CPU {
		t.Errorf("CPU went from %+v to %+v", before, after)
	}
}

// TestReadProcStatIdentity: the state, parent and start time that tell a
// running process from a zombie, a gone one and a later one with its PID.
func TestReadProcStatIdentity(t *testing.T) {
	self, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !self.Alive() || self.PPID != os.Getppid() || self.StartTicks == 0 {
		t.Errorf("ReadProcStat(self) = %+v; want alive, parent %d and a start time", self, os.Getppid())
	}
	// A child that exited and is not yet reaped is a zombie, not alive.
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	var child ProcStat
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if child, err = ReadProcStat(pid); err != nil || child.State == 'Z' || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || child.Alive() || child.PPID != os.Getpid() || child.StartTicks < self.StartTicks || alive(pid) {
		t.Errorf("ReadProcStat(exited child) = %+v, %v, alive %t; want a zombie whose parent is %d, started after us", child, err, alive(pid), os.Getpid())
	}
	cmd.Wait()
	if _, err := ReadProcStat(pid); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadProcStat(reaped child) error = %v; want fs.ErrNotExist", err)
	}
}
