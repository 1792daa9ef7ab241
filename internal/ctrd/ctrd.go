// Package ctrd runs a private containerd (its own root, state and socket,
// never the system's) with forkvisor's runsc shim, for tests.
package ctrd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// Start starts containerd from containerdBin (a directory with containerd
// and ctr) in dir, with the runsc shim and runsc from repoBin on its PATH.
func Start(dir, containerdBin, repoBin string) (*Containerd, error) {
	c := &Containerd{dir: dir, binDir: containerdBin}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  disable = true
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.socket())
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		return nil, err
	}
	c.RuntimeConfig = filepath.Join(dir, "runsc.toml")
	runscConfig := fmt.Sprintf(`binary_name = %q
root = %q
[runsc_config]
  network = "none"
  platform = "systrap"
  base-store = %q
`, filepath.Join(repoBin, "runsc"), filepath.Join(dir, "runsc-root"), c.baseStore())
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
	return &sandbox.Runsc{Bin: bin, Root: filepath.Join(c.dir, "runsc-root", "default"), BaseStore: c.baseStore()}
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
