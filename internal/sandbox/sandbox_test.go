package sandbox

import (
	"os"
	"testing"
	"time"
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
