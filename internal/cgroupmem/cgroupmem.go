// Package cgroupmem puts a group of processes in a memory cgroup of its own
// and reads what the kernel charges to it: the memory an orchestrator sees
// (and limits) for a pod, as opposed to Pss, which splits shared pages
// among their users. It works on cgroup v1 (memory.usage_in_bytes) and v2
// (memory.current). Root only.
//
// Pages are charged to the cgroup of the process that first faulted or
// wrote them, and stay charged there: a page-cache page that another
// group read first (a shared base written by the checkpoint of a sandbox
// outside the group) is not charged to the group at all.
package cgroupmem

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Root is the mount point of the cgroup hierarchies.
const Root = "/sys/fs/cgroup"

// Group is a memory cgroup.
type Group struct {
	dir string
	v2  bool
}

// New creates the memory cgroup forkbench/name (removing a leftover one
// of that name first).
func New(name string) (*Group, error) {
	g := &Group{}
	if _, err := os.Stat(filepath.Join(Root, "cgroup.controllers")); err == nil {
		g.v2 = true
		g.dir = filepath.Join(Root, "forkbench", name)
		// The memory controller must be enabled for the children of each
		// ancestor.
		if err := os.MkdirAll(filepath.Dir(g.dir), 0o755); err != nil {
			return nil, err
		}
		for _, d := range []string{Root, filepath.Dir(g.dir)} {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
				return nil, fmt.Errorf("enabling the memory controller below %s: %w", d, err)
			}
		}
	} else {
		g.dir = filepath.Join(Root, "memory", "forkbench", name)
		if _, err := os.Stat(filepath.Dir(filepath.Dir(g.dir))); err != nil {
			return nil, fmt.Errorf("no cgroup v2 and no v1 memory hierarchy under %s: %w", Root, err)
		}
	}
	if err := removeDir(g.dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", g.dir, err)
	}
	return g, nil
}

// Dir returns the cgroup's directory.
func (g *Group) Dir() string { return g.dir }

// Command returns a command that runs name with args inside g: a shell
// moves itself into g, then executes name, so that every process it starts
// is charged to g from its first page. (exec.Cmd's CgroupFD would do the
// same without the shell, but only on cgroup v2.)
func (g *Group) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(g.dir, "cgroup.procs"), name}, args...)...)
}

// Usage returns the bytes charged to g and its descendants.
func (g *Group) Usage() (uint64, error) {
	file := "memory.usage_in_bytes"
	if g.v2 {
		file = "memory.current"
	}
	b, err := os.ReadFile(filepath.Join(g.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// Remove removes g once its processes have exited (waiting up to 10 s for
// them to go).
func (g *Group) Remove() error {
	return removeDir(g.dir)
}

// removeDir removes the cgroup dir and its descendants, deepest first,
// retrying while processes are still leaving. A missing dir is not an
// error.
func removeDir(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := os.Remove(dirs[i])
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("removing cgroup %s: %w", dirs[i], err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
