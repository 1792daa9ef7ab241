// Package ctrd runs a private containerd (its own root, state and socket,
// never the system's) with forkvisor's runsc shim, for tests.
package ctrd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// Containerd is a running private containerd.
type Containerd struct {
	dir, binDir string
	cmd         *exec.Cmd
	env         []string
	// RuntimeConfig is the shim's runsc options file.
	RuntimeConfig string
}

// CRI configures containerd's CRI plugin, as a kubelet's node would have
// it: a RuntimeClass handler "runsc" for the runsc shim and pod networking
// by CNI (Debian's bridge and host-local plugins). containerd then runs in
// a network namespace of its own, which holds the pods' bridge: no traffic
// leaves the machine.
type CRI struct {
	// SandboxImage is the pod sandbox ("pause") image; it must be imported
	// into containerd's namespace "k8s.io".
	SandboxImage string
	// CNIBinDir holds the CNI plugins (Debian's, tools/cni.sh).
	CNIBinDir string
}

// RuntimeHandler is the CRI runtime handler (RuntimeClass handler) that
// selects the runsc shim when cri is enabled.
const RuntimeHandler = "runsc"

// Start starts containerd from containerdBin (a directory with containerd
// and ctr) in dir, with the runsc shim and runsc from repoBin on its PATH.
// If cri is nil, the CRI plugin is disabled.
func Start(dir, containerdBin, repoBin string, cri *CRI) (*Containerd, error) {
	c := &Containerd{dir: dir, binDir: containerdBin}
	c.RuntimeConfig = filepath.Join(dir, "runsc.toml")
	criConfig := `[plugins."io.containerd.grpc.v1.cri"]
  disable = true
`
	network := "none"
	if cri != nil {
		// runsc's own network stack, over the pod's network namespace.
		network = "sandbox"
		cniConf := filepath.Join(dir, "cni")
		if err := os.MkdirAll(cniConf, 0o755); err != nil {
			return nil, err
		}
		// Pods on a bridge in containerd's own network namespace;
		// containerd adds each pod's loopback interface itself.
		conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "forkvisor-pods", "plugins": [{"type": "bridge", "bridge": "fvbr0", "isGateway": true, "ipMasq": false, "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.77.0/24"}]], "dataDir": %q}}]}`+"\n", filepath.Join(dir, "cni-ipam"))
		if err := os.WriteFile(filepath.Join(cniConf, "10-pods.conflist"), []byte(conf), 0o644); err != nil {
			return nil, err
		}
		criConfig = fmt.Sprintf(`[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = %q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%s]
    runtime_type = "io.containerd.runsc.v1"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%s.options]
      TypeUrl = "io.containerd.runsc.v1.options"
      ConfigPath = %q
`, cri.SandboxImage, cri.CNIBinDir, cniConf, RuntimeHandler, RuntimeHandler, RuntimeHandler, c.RuntimeConfig)
	}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
%s`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.socket(), criConfig)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		return nil, err
	}
	runscConfig := fmt.Sprintf(`binary_name = %q
root = %q
[runsc_config]
  network = %q
  platform = "systrap"
  base-store = %q
`, filepath.Join(repoBin, "runsc"), filepath.Join(dir, "runsc-root"), network, c.baseStore())
	if err := os.WriteFile(c.RuntimeConfig, []byte(runscConfig), 0o644); err != nil {
		return nil, err
	}
	c.env = append(os.Environ(), "PATH="+repoBin+":"+containerdBin+":"+os.Getenv("PATH"))
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		return nil, err
	}
	c.cmd = exec.Command(filepath.Join(containerdBin, "containerd"), "--config", filepath.Join(dir, "config.toml"))
	// Run from / so that containerd does not pick a shim from its working
	// directory.
	c.cmd.Dir = "/"
	c.cmd.Env = c.env
	c.cmd.Stdout = log
	c.cmd.Stderr = log
	if cri != nil {
		c.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	}
	if err := c.cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	log.Close()
	for i := 0; i < 100; i++ {
		if _, err := c.Ctr("version"); err == nil {
			return c, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Stop()
	return nil, fmt.Errorf("containerd did not come up; log: %s", filepath.Join(dir, "containerd.log"))
}

// ContentBytes returns the bytes that containerd's content store holds.
func (c *Containerd) ContentBytes() (int64, error) {
	var n int64
	err := filepath.WalkDir(filepath.Join(c.dir, "root", "io.containerd.content.v1.content"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Size()
		return nil
	})
	return n, err
}

func (c *Containerd) baseStore() string {
	return filepath.Join(c.dir, "bases")
}

// Runsc returns runsc (bin) with the root and node base store that the shim
// gives the sandboxes of containerd's namespace "default".
func (c *Containerd) Runsc(bin string) *sandbox.Runsc {
	return c.RunscIn(bin, "default")
}

// RunscIn is Runsc for containerd's namespace ns ("k8s.io" for CRI).
func (c *Containerd) RunscIn(bin, ns string) *sandbox.Runsc {
	return &sandbox.Runsc{Bin: bin, Root: filepath.Join(c.dir, "runsc-root", ns), BaseStore: c.baseStore()}
}

// Socket is containerd's gRPC socket (also the CRI endpoint).
func (c *Containerd) Socket() string {
	return c.socket()
}

func (c *Containerd) socket() string {
	return filepath.Join(c.dir, "containerd.sock")
}

// Ctr runs ctr against c and returns its combined output.
func (c *Containerd) Ctr(args ...string) (string, error) {
	cmd := c.CtrCommand(args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// CtrCommand returns a ctr command against c.
func (c *Containerd) CtrCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.binDir, "ctr"), append([]string{"--address", c.socket()}, args...)...)
	cmd.Dir = "/"
	cmd.Env = c.env
	return cmd
}

// RunArgs are the ctr run flags that select the runsc shim.
func (c *Containerd) RunArgs() []string {
	return []string{"--runtime", "io.containerd.runsc.v1", "--runtime-config-path", c.RuntimeConfig}
}

// Stop stops containerd and everything it started (shims, sandboxes), and
// unmounts what is left under its directory.
func (c *Containerd) Stop() {
	if c.cmd != nil && c.cmd.Process != nil {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
	// Shims and sandboxes name the directory on their command lines.
	sandbox.KillByArg(c.dir)
	sandbox.UnmountUnder(c.dir)
}

// ExitCode returns the exit code of a finished command's error.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
