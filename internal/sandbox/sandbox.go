// Package sandbox drives real runsc sandboxes for forkvisor's tests and
// benchmarks: OCI bundles around a static workload, run, checkpoint,
// restore, output following and clean teardown.
package sandbox

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/basestore"
)

// Runsc is one runsc binary with its own state root.
type Runsc struct {
	// Bin is the runsc binary.
	Bin string
	// Root is the --root state directory; it is created if missing.
	Root string
	// LogDir, if set, receives runsc debug logs (--debug-log).
	LogDir string
	// LogInfo logs into LogDir at runsc's default level (info) instead of
	// with --debug, which adds work to every RPC and syscall path it logs.
	LogInfo bool
	// BaseStore is the node base store (--base-store) of the fork; default
	// Root+"-bases", so that tests and benchmarks never fill the host's
	// store. Empty for a runsc without the flag (upstream): see Upstream.
	BaseStore string
	// Upstream marks an upstream runsc, which has no --base-store.
	Upstream bool
	// Network is the --network mode; default "none". With "sandbox" the
	// bundle names the network namespace to use (SetNetNS).
	Network string
	// Flags are more global flags, given before the subcommand.
	Flags []string
}

// StorePath returns the node base store r uses.
func (r *Runsc) StorePath() string {
	if r.BaseStore != "" {
		return r.BaseStore
	}
	return r.Root + "-bases"
}

// StoredBase returns the path of the base with digest ("sha256:HEX" or
// HEX) in r's node base store: the layout runsc's base store uses.
func (r *Runsc) StoredBase(digest string) string {
	return filepath.Join(r.StoreEntry(digest), basestore.ImageName)
}

// StoreEntry returns the directory of the base with digest ("sha256:HEX"
// or HEX) in r's node base store, which holds base.img and its write set.
func (r *Runsc) StoreEntry(digest string) string {
	return basestore.Entry(r.StorePath(), digest)
}

// Command returns the command that runs runsc subcommand args with r's
// global flags (--root, --network, --platform, the fork's --base-store, the
// debug log), for callers that must start, time or kill it themselves.
func (r *Runsc) Command(args ...string) *exec.Cmd {
	network := r.Network
	if network == "" {
		network = "none"
	}
	global := []string{"--root", r.Root, "--network=" + network, "--platform=systrap"}
	if !r.Upstream {
		global = append(global, "--base-store="+r.StorePath())
	}
	if r.LogDir != "" {
		if !r.LogInfo {
			global = append(global, "--debug")
		}
		global = append(global, "--debug-log="+r.LogDir+"/")
	}
	global = append(global, r.Flags...)
	return exec.Command(r.Bin, append(global, args...)...)
}

// Exec runs a runsc subcommand and returns its combined output.
func (r *Runsc) Exec(args ...string) (string, error) {
	out, _, err := r.execWithCPU(args...)
	return out, err
}

// execWithCPU is Exec, and also returns the CPU time that the runsc command
// used (CommandCPU).
func (r *Runsc) execWithCPU(args ...string) (string, time.Duration, error) {
	if err := os.MkdirAll(r.Root, 0o711); err != nil {
		return "", 0, err
	}
	cmd := r.Command(args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), CommandCPU(cmd), fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), CommandCPU(cmd), nil
}

// startDetached runs a detaching runsc subcommand (run or restore) with the
// container's stdout and stderr going to outPath.
// It returns the CPU time that the runsc command used (CommandCPU).
func (r *Runsc) startDetached(outPath string, args ...string) (time.Duration, error) {
	d, err := r.detachedCommand(outPath, args...)
	if err != nil {
		return 0, err
	}
	defer d.close(true)
	if err := d.cmd.Run(); err != nil {
		return CommandCPU(d.cmd), d.failed(err)
	}
	return CommandCPU(d.cmd), nil
}

// detached is a detaching runsc subcommand whose standard output is the
// container's output file and whose standard error is a temporary file.
type detached struct {
	cmd  *exec.Cmd
	args []string
	out  *os.File
	errf *os.File
}

// detachedCommand prepares runsc subcommand args for startDetached or
// StartRestore; the caller runs d.cmd and then calls d.close.
func (r *Runsc) detachedCommand(outPath string, args ...string) (*detached, error) {
	if err := os.MkdirAll(r.Root, 0o711); err != nil {
		return nil, err
	}
	out, err := os.OpenFile(outPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// runsc's own stderr must be a file too: a pipe would be inherited by the
	// detached sandbox and never reach EOF.
	errf, err := os.CreateTemp("", "runsc-stderr-")
	if err != nil {
		out.Close()
		return nil, err
	}
	d := &detached{cmd: r.Command(args...), args: args, out: out, errf: errf}
	d.cmd.Stdout = out
	d.cmd.Stderr = errf
	return d, nil
}

// failed returns err, from running d, with what runsc wrote to its stderr.
func (d *detached) failed(err error) error {
	msg, _ := os.ReadFile(d.errf.Name())
	return fmt.Errorf("runsc %s: %w: %s", strings.Join(d.args, " "), err, strings.TrimSpace(string(msg)))
}

// close closes d's descriptors of its files once its command has started
// (the child has its own) or has ended, and removes the stderr file if
// remove is set.
func (d *detached) close(remove bool) {
	d.out.Close()
	d.errf.Close()
	if remove {
		os.Remove(d.errf.Name())
	}
}

// Run starts container id from bundle, detached; its output goes to outPath.
func (r *Runsc) Run(bundle, id, outPath string) error {
	_, err := r.startDetached(outPath, "run", "--bundle", bundle, "--detach", id)
	return err
}

// Create creates container id from bundle without starting it: its sandbox
// and gofer processes wait for a start or a restore (runsc restore of the
// same id). The container's output goes to outPath.
func (r *Runsc) Create(bundle, id, outPath string) error {
	_, err := r.startDetached(outPath, "create", "--bundle", bundle, id)
	return err
}

// Restore restores container id from imageDir into bundle, detached; its
// output goes to outPath. extra flags go before the container ID.
func (r *Runsc) Restore(bundle, id, imageDir, outPath string, extra ...string) error {
	_, err := r.RestoreWithCPU(bundle, id, imageDir, outPath, extra...)
	return err
}

// RestoreWithCPU is Restore, and returns the CPU time that the runsc
// restore command used (not its sandbox's: SandboxTreeCPU).
func (r *Runsc) RestoreWithCPU(bundle, id, imageDir, outPath string, extra ...string) (time.Duration, error) {
	args := append([]string{"restore", "--image-path", imageDir, "--bundle", bundle, "--detach"}, extra...)
	return r.startDetached(outPath, append(args, id)...)
}

// Checkpoint checkpoints container id into imageDir. extra flags go before
// the container ID.
func (r *Runsc) Checkpoint(id, imageDir string, extra ...string) error {
	args := append([]string{"checkpoint", "--image-path", imageDir}, extra...)
	_, err := r.Exec(append(args, id)...)
	return err
}

// Destroy kills and deletes container id, ignoring errors.
func (r *Runsc) Destroy(id string) {
	r.Command("kill", id, "KILL").Run()
	for i := 0; i < 50; i++ {
		if r.Command("delete", "--force", id).Run() == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// SandboxPID returns the PID of container id's sandbox process, from runsc's
// state file.
func (r *Runsc) SandboxPID(id string) (int, error) {
	st, err := r.stateFile(id)
	if err != nil {
		return 0, err
	}
	if st.Sandbox.Pid <= 0 {
		return 0, fmt.Errorf("container %s has no sandbox process (status %q)", id, st.Status)
	}
	return st.Sandbox.Pid, nil
}

// SentryCPU returns the CPU time (user and system) that container id's
// sandbox process (the sentry) has used so far. Its systrap stubs, which run
// the application, are separate processes and not included.
func (r *Runsc) SentryCPU(id string) (time.Duration, error) {
	pid, err := r.SandboxPID(id)
	if err != nil {
		return 0, err
	}
	return ProcessCPU(pid)
}

// clockTicksPerSecond is USER_HZ, the unit of /proc/PID/stat's times; Linux
// reports it as 100 on every architecture.
const clockTicksPerSecond = 100

// ProcessCPU returns the CPU time (utime+stime) of process pid, from
// /proc/PID/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	st, err := ReadProcStat(pid)
	return st.CPU, err
}

// ProcStat is what /proc/PID/stat says of a process: its state, parent
// and start, and its costs so far.
type ProcStat struct {
	// State is its state letter (R, S, D, Z for a zombie, X when dead...).
	State byte
	// PPID is its parent's PID.
	PPID int
	// StartTicks is its start time in clock ticks after boot, which tells
	// a process from a later one that reused its PID.
	StartTicks uint64
	// UserCPU and CPU are its user time and its user and system time.
	UserCPU, CPU time.Duration
	// ReapedCPU is the user and system time of its children that have
	// exited and that it has waited for (and of theirs).
	ReapedCPU time.Duration
	// MinorFaults and MajorFaults count its host page faults.
	MinorFaults, MajorFaults int64
}

// Alive reports whether the process has not exited: it is neither a zombie
// nor dead.
func (st ProcStat) Alive() bool { return st.State != 'Z' && st.State != 'X' }

// ReadProcStat returns what /proc/PID/stat says of process pid. The error
// wraps fs.ErrNotExist if there is no such process, or syscall.ESRCH if it
// was reaped while the file was read.
func ReadProcStat(pid int) (ProcStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcStat{}, err
	}
	// The command name (field 2) may hold spaces; fields after it start at
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat: no command name in %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid, minflt, majflt, utime, stime, cutime,
	// cstime and starttime are fields 4, 10, 12, 14, 15, 16, 17 and 22.
	if len(f) < 20 || len(f[0]) != 1 {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want at least 20 and a one-letter state: %q", pid, len(f), b[i+1:])
	}
	var v [8]int64
	for k, idx := range []int{1, 7, 9, 11, 12, 19, 13, 14} {
		n, err := strconv.ParseInt(f[idx], 10, 64)
		if err != nil {
			return ProcStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		v[k] = n
	}
	tick := time.Second / clockTicksPerSecond
	return ProcStat{
		State:       f[0][0],
		PPID:        int(v[0]),
		StartTicks:  uint64(v[5]),
		UserCPU:     time.Duration(v[3]) * tick,
		CPU:         time.Duration(v[3]+v[4]) * tick,
		ReapedCPU:   time.Duration(v[6]+v[7]) * tick,
		MinorFaults: v[1],
		MajorFaults: v[2],
	}, nil
}

// Cleanup destroys every container under r.Root and unmounts what runsc left
// mounted there (e.g. the nsfs bind mount for --network=none), so that the
// root directory can be removed.
func (r *Runsc) Cleanup() {
	if out, err := r.Command("list", "-quiet").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			r.Destroy(id)
		}
	}
	// Whatever runsc lost track of (e.g. after a failed restore) still
	// names the root on its command line.
	KillByArg(r.Root)
	UnmountUnder(r.Root)
}

// PIDsByArg returns every process, other than this one, that has an
// argument equal to s, of the form --flag=s, or naming a path below s
// (s/...). A substring never matches: /tmp/a/root does not match a process
// of /tmp/a/root2.
func PIDsByArg(s string) []int {
	self := os.Getpid()
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !hasArg(cmdline, s) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// KillByArg sends SIGKILL to every process that PIDsByArg(s) returns, and
// waits briefly for them to exit.
func KillByArg(s string) {
	pids := PIDsByArg(s)
	for _, pid := range pids {
		unix.Kill(pid, unix.SIGKILL)
	}
	for i := 0; i < 50 && len(pids) > 0; i++ {
		alive := pids[:0]
		for _, pid := range pids {
			if unix.Kill(pid, 0) == nil {
				alive = append(alive, pid)
			}
		}
		pids = alive
		time.Sleep(20 * time.Millisecond)
	}
}

// hasArg reports whether the NUL-separated cmdline has an argument equal to
// s, of the form --flag=s, or naming a path below s.
func hasArg(cmdline []byte, s string) bool {
	for _, a := range bytes.Split(cmdline, []byte{0}) {
		arg := string(a)
		if arg == s || strings.HasSuffix(arg, "="+s) || strings.HasPrefix(arg, s+"/") {
			return true
		}
		if _, v, ok := strings.Cut(arg, "="); ok && strings.HasPrefix(v, s+"/") {
			return true
		}
	}
	return false
}

// UnmountUnder lazily unmounts every mount point at or below dir, deepest
// first.
func UnmountUnder(dir string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := fields[4]
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			points = append(points, mp)
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		unix.Unmount(points[i], unix.MNT_DETACH)
	}
}

// NewBundle creates an OCI bundle in dir whose root filesystem holds the
// static binary bin as /workload, running /workload with args, with the Go
// garbage collector off (the tick workload's heap then never moves or
// shrinks between checkpoints).
func NewBundle(dir, bin string, args ...string) error {
	return NewBundleEnv(dir, bin, []string{"PATH=/", "GOGC=off"}, args...)
}

// NewBundleEnv is NewBundle with the process environment env.
func NewBundleEnv(dir, bin string, env []string, args ...string) error {
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "workload"), data, 0o755); err != nil {
		return err
	}
	spec := map[string]any{
		"ociVersion": "1.0.0",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": 0, "gid": 0},
			"args":     append([]string{"/workload"}, args...),
			"env":      env,
			"cwd":      "/",
		},
		"root":     map[string]any{"path": "rootfs", "readonly": false},
		"hostname": "forkvisor",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
		},
		"linux": map[string]any{
			"namespaces": []map[string]any{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
		},
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

// Lines returns the complete lines of the file at path.
func Lines(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	s := string(b)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	} else {
		return nil
	}
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// WaitForLine polls path until a complete line at index >= from satisfies
// match, and returns that line and its index.
func WaitForLine(path string, from int, timeout time.Duration, match func(string) bool) (string, int, error) {
	return WaitForLineEvery(path, from, timeout, 10*time.Millisecond, match)
}

// WaitForLineEvery is WaitForLine polling every interval.
func WaitForLineEvery(path string, from int, timeout, interval time.Duration, match func(string) bool) (string, int, error) {
	deadline := time.Now().Add(timeout)
	for {
		lines := Lines(path)
		for i := from; i < len(lines); i++ {
			if match(lines[i]) {
				return lines[i], i, nil
			}
		}
		if time.Now().After(deadline) {
			last := "(no output)"
			if len(lines) > 0 {
				last = lines[len(lines)-1]
			}
			return "", 0, fmt.Errorf("%s: no matching line within %v after line %d; last line: %s", path, timeout, from, last)
		}
		time.Sleep(interval)
	}
}

// GoferPID returns the gofer PID of container id from runsc's state file, or
// 0 if it has none.
func (r *Runsc) GoferPID(id string) int {
	st, _ := r.stateFile(id)
	return st.GoferPid
}

// stateFileInfo is what the harness reads of a container's runsc state file.
type stateFileInfo struct {
	Status   string `json:"status"`
	GoferPid int    `json:"goferPid"`
	Sandbox  struct {
		Pid int `json:"pid"`
	} `json:"sandbox"`
}

// stateFile reads container id's state file under r.Root without running
// runsc (so without its lock: a snapshot good for liveness checks).
func (r *Runsc) stateFile(id string) (stateFileInfo, error) {
	var st stateFileInfo
	matches, _ := filepath.Glob(filepath.Join(r.Root, "*_sandbox:"+id+".state"))
	if len(matches) == 0 {
		return st, fmt.Errorf("no state file for container %s under %s", id, r.Root)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", matches[0], err)
	}
	return st, nil
}

// Waiting reports whether container id is created and its sandbox process
// is alive: a restore or start of it can proceed.
func (r *Runsc) Waiting(id string) bool {
	return r.liveIn(id, "created")
}

// Paused reports whether container id is paused (`runsc pause`, or
// restored with `runsc restore --paused`) and its sandbox process lives.
func (r *Runsc) Paused(id string) bool {
	return r.liveIn(id, "paused")
}

// liveIn reports whether runsc's state file says container id is in status
// and its sandbox process lives.
func (r *Runsc) liveIn(id, status string) bool {
	st, err := r.stateFile(id)
	return err == nil && st.Status == status && st.Sandbox.Pid > 0 && alive(st.Sandbox.Pid)
}

// Resume resumes paused container id.
func (r *Runsc) Resume(id string) error {
	_, err := r.ResumeWithCPU(id)
	return err
}

// ResumeWithCPU is Resume, and returns the CPU time that the runsc resume
// command used.
func (r *Runsc) ResumeWithCPU(id string) (time.Duration, error) {
	_, cpu, err := r.execWithCPU("resume", id)
	return cpu, err
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	st, err := ReadProcStat(pid)
	return err == nil && st.Alive()
}

// Annotate adds annotations to the OCI spec of the bundle in dir.
func Annotate(dir string, annotations map[string]string) error {
	return editSpec(dir, func(spec map[string]any) {
		a, _ := spec["annotations"].(map[string]any)
		if a == nil {
			a = map[string]any{}
		}
		for k, v := range annotations {
			a[k] = v
		}
		spec["annotations"] = a
	})
}

// SetNetNS makes the bundle in dir join the network namespace at path
// (replacing any network namespace it names).
func SetNetNS(dir, path string) error {
	return editLinux(dir, func(linux map[string]any) {
		nss, _ := linux["namespaces"].([]any)
		kept := []any{map[string]any{"type": "network", "path": path}}
		for _, ns := range nss {
			if m, ok := ns.(map[string]any); ok && m["type"] == "network" {
				continue
			}
			kept = append(kept, ns)
		}
		linux["namespaces"] = kept
	})
}

// SetCgroupsPath sets the cgroup path (linux.cgroupsPath, relative to the
// root of each cgroup hierarchy) of the bundle in dir: runsc puts every
// sandbox of the bundle there, from the sandbox's first page. Without one,
// runsc uses "/" + the container ID.
func SetCgroupsPath(dir, path string) error {
	return editLinux(dir, func(linux map[string]any) { linux["cgroupsPath"] = path })
}

// editLinux rewrites the "linux" object of the bundle's spec in dir
// through edit, creating it if the spec has none.
func editLinux(dir string, edit func(linux map[string]any)) error {
	return editSpec(dir, func(spec map[string]any) {
		linux, _ := spec["linux"].(map[string]any)
		if linux == nil {
			linux = map[string]any{}
		}
		edit(linux)
		spec["linux"] = linux
	})
}

// editSpec rewrites the OCI spec of the bundle in dir through edit.
func editSpec(dir string, edit func(spec map[string]any)) error {
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	edit(spec)
	if b, err = json.MarshalIndent(spec, "", "  "); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
