package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The pyagent workload: CPython (asyncio) over a state of many small
// objects, which it reads, and so writes (reference counts), every tick. It
// runs on a Debian root filesystem with python3 built by tools/pyrootfs.sh
// and prints the tick workload's lines (ParseTick).
const (
	// PyRootfsDir is the root filesystem tools/pyrootfs.sh builds,
	// relative to the repository root.
	PyRootfsDir = "build/pyrootfs"
	// PyAgentScript is the workload's source, relative to the repository
	// root.
	PyAgentScript = "test/workloads/pyagent/agent.py"
	// PyAgentPath is where a pyagent bundle shows the script inside the
	// sandbox.
	PyAgentPath = "/opt/agent.py"

	// pyRootfsStamp is the file tools/pyrootfs.sh writes last.
	pyRootfsStamp = ".forkvisor-complete"
	pyAgentMount  = "/opt"
)

// PyRootfs returns the absolute path of the Python root filesystem of the
// repository at repoRoot, or an error that says how to build it if it is
// missing or incomplete.
func PyRootfs(repoRoot string) (string, error) {
	dir, err := filepath.Abs(filepath.Join(repoRoot, PyRootfsDir))
	if err != nil {
		return "", err
	}
	if err := checkPyRootfs(dir); err != nil {
		return "", fmt.Errorf("%w (build it with tools/pyrootfs.sh, as root)", err)
	}
	return dir, nil
}

// checkPyRootfs checks that dir is a complete root filesystem from
// tools/pyrootfs.sh, with python3 and an empty mount point for the agent.
func checkPyRootfs(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("no Python rootfs: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, pyRootfsStamp)); err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return fmt.Errorf("Python rootfs %s is incomplete (no %s)", dir, pyRootfsStamp)
	}
	// usr/bin/python3 is a symlink (python3.11): resolve it inside dir,
	// not on the host.
	py := filepath.Join(dir, "usr/bin/python3")
	if target, err := os.Readlink(py); err == nil {
		if filepath.IsAbs(target) {
			py = filepath.Join(dir, target)
		} else {
			py = filepath.Join(filepath.Dir(py), target)
		}
	}
	if st, err := os.Stat(py); err != nil || st.Mode()&0o111 == 0 {
		return fmt.Errorf("Python rootfs %s has no executable /usr/bin/python3", dir)
	}
	if st, err := os.Stat(filepath.Join(dir, pyAgentMount)); err != nil || !st.IsDir() {
		return fmt.Errorf("Python rootfs %s has no %s directory to mount the agent on", dir, pyAgentMount)
	}
	return nil
}

// PyAgentArgs returns the command line of the agent in a pyagent bundle:
// entries entries, one tick per interval, then extra flags of agent.py.
func PyAgentArgs(entries int, interval time.Duration, extra ...string) []string {
	args := []string{"/usr/bin/python3", PyAgentPath,
		"--entries", strconv.Itoa(entries),
		"--interval", strconv.FormatFloat(interval.Seconds(), 'f', -1, 64)}
	return append(args, extra...)
}

// PyAgentHolderCtl is the command file of the child that the agent's "hold"
// command forks (the default: the agent's own command file plus ".child").
const PyAgentHolderCtl = "/tmp/ctl.child"

// PyAgentSend returns the command that, run in a pyagent sandbox with
// `runsc exec ID ...`, hands cmd ("mark", "fork", "hold", "dump") to the
// agent; extra flags go to agent.py (e.g. "--ctl", PyAgentHolderCtl, for
// the holder child's commands).
func PyAgentSend(cmd string, extra ...string) []string {
	return append([]string{"/usr/bin/python3", PyAgentPath, "--send", cmd}, extra...)
}

// NewPyAgentBundle creates an OCI bundle in dir that runs the pyagent
// workload of the repository at repoRoot with entries entries and one tick
// per interval; extra flags go to agent.py.
//
// The root filesystem is the shared PyRootfs, mounted read-only (so no
// overlay and no filestore is created in it). agent.py is copied into
// dir/pyagent, which is bind-mounted read-only at /opt: a parked sandbox
// keeps the script it started with. /tmp (the command file) is a tmpfs.
func NewPyAgentBundle(dir, repoRoot string, entries int, interval time.Duration, extra ...string) error {
	rootfs, err := PyRootfs(repoRoot)
	if err != nil {
		return err
	}
	script, err := os.ReadFile(filepath.Join(repoRoot, PyAgentScript))
	if err != nil {
		return err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return err
	}
	agentDir := filepath.Join(dir, "pyagent")
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(agentDir, filepath.Base(PyAgentPath)), script, 0o644); err != nil {
		return err
	}
	spec := pyAgentSpec(rootfs, agentDir, PyAgentArgs(entries, interval, extra...))
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

// pyAgentSpec is the OCI spec of a pyagent bundle; it differs from
// NewBundleEnv's in the root (read-only, shared) and the agent mount.
func pyAgentSpec(rootfs, agentDir string, args []string) map[string]any {
	return map[string]any{
		"ociVersion": "1.0.0",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": 0, "gid": 0},
			"args":     args,
			// The tree is read-only: do not try to write bytecode.
			"env": []string{"PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"},
			"cwd": "/",
		},
		"root":     map[string]any{"path": rootfs, "readonly": true},
		"hostname": "forkvisor",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
			{"destination": pyAgentMount, "type": "bind", "source": agentDir, "options": []string{"rbind", "ro"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]any{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
		},
	}
}
