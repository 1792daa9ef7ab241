package sandbox

import (
	"os"
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
