package cgroupmem

import (
	"os"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/prereq"
)

// TestChargesTheGroup starts a process that touches 64 MiB inside a new
// group and checks that the group is charged for it, then removes the
// group.
func TestChargesTheGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Missing(t, "not root: creating a cgroup needs root")
	}
	g, err := New("cgroupmem-test")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	before, err := g.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// dd writes 64 MiB of zeroes into a buffer it allocates: anonymous
	// memory that the kernel charges to the group.
	cmd := g.Command("/bin/sh", "-c", "head -c 67108864 /dev/zero | (dd bs=64M count=1 iflag=fullblock of=/dev/null 2>/dev/null; sleep 2)")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var peak uint64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		u, err := g.Usage()
		if err != nil {
			t.Fatal(err)
		}
		peak = max(peak, u)
	}
	cmd.Wait()
	if peak < before+48<<20 {
		t.Errorf("group charged at most %d bytes (%d before) while a member held 64 MiB", peak, before)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Dir()); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Remove: %v", g.Dir(), err)
	}
}
