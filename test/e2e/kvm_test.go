package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestKVMOnPVMFailsFast checks that --platform=kvm is refused with a clear
// error on a host whose /dev/kvm comes from kvm_pvm, instead of hanging. On
// a host of this kind where kvm_pvm registered no /dev/kvm (seen on
// 2026-12-02 and 2026-12-06), runsc must fail as fast, naming the device
// it could not open, as upstream's does.
func TestKVMOnPVMFailsFast(t *testing.T) {
	bin := binary(t, "runsc")
	if _, err := os.Stat("/sys/module/kvm_pvm"); err != nil {
		t.Skip("this host's /dev/kvm is not PVM")
	}
	want := "use --platform=systrap"
	if _, err := os.Stat("/sys/class/misc/kvm"); err != nil {
		want = "(/dev/kvm): no such file or directory"
	}
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			t.Skipf("%s is loaded; the KVM platform may work here", m)
		}
	}
	root := filepath.Join(t.TempDir(), "root")
	defer sandbox.UnmountUnder(root)
	cmd := exec.Command(bin, "--root", root, "--platform=kvm", "--network=none", "do", "true")
	done := make(chan struct{})
	var out []byte
	var err error
	start := time.Now()
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		sandbox.KillByArg(root)
		t.Fatal("runsc --platform=kvm did not fail within 60s")
	}
	if err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("runsc --platform=kvm: err %v, output %q; want an error that says %q", err, out, want)
	}
	t.Logf("refused in %v: %s", time.Since(start), strings.TrimSpace(string(out)))
}
