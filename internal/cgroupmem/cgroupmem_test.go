package cgroupmem

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkvisor/forkvisor/internal/prereq"
)

// TestChargesTheGroup has a process inside a new group write 64 MiB of
// tmpfs and checks that the group is charged for it, then removes the
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
	// A member writes 64 MiB into a tmpfs file: shmem pages, charged to
	// the group and kept (unlike a process's heap) until the file goes.
	shm := filepath.Join("/dev/shm", fmt.Sprintf("cgroupmem-test-%d", os.Getpid()))
	defer os.Remove(shm)
	cmd := g.Command("/bin/sh", "-c", `head -c 67108864 /dev/zero > "$1"`, "sh", shm)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writing %s inside the group: %v: %s", shm, err, out)
	}
	charged, err := g.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if charged < before+48<<20 {
		t.Errorf("group charged %d bytes (%d before) after a member wrote 64 MiB of tmpfs", charged, before)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Dir()); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Remove: %v", g.Dir(), err)
	}
}
