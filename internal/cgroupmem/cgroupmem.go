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
	// path is the cgroup's path relative to the root of a hierarchy.
	path string
	// dir is its directory in the memory hierarchy.
	dir string
	v2  bool
}

// New creates the memory cgroup forkbench/name (removing a leftover one
// of that name first).
func New(name string) (*Group, error) {
	g := &Group{path: "/forkbench/" + name}
	if _, err := os.Stat(filepath.Join(Root, "cgroup.controllers")); err == nil {
		g.v2 = true
		g.dir = filepath.Join(Root, g.path)
		// The memory controller must be enabled for the children of each
		// ancestor.
		if err := os.MkdirAll(filepath.Dir(g.dir), 0o755); err != nil {
			return nil, err
		}
		for _, d := range []string{Root, filepath.Dir(g.dir)} {
			control := filepath.Join(d, "cgroup.subtree_control")
			if b, err := os.ReadFile(control); err == nil && strings.Contains(" "+string(b)+" ", " memory ") {
				continue
			}
			if err := os.WriteFile(control, []byte("+memory"), 0); err != nil {
				return nil, fmt.Errorf("enabling the memory controller below %s: %w", d, err)
			}
		}
	} else {
		g.dir = filepath.Join(Root, "memory", g.path)
		if _, err := os.Stat(filepath.Dir(filepath.Dir(g.dir))); err != nil {
			return nil, fmt.Errorf("no cgroup v2 and no v1 memory hierarchy under %s: %w", Root, err)
		}
	}
	if err := g.Remove(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", g.dir, err)
	}
	return g, nil
}

// Dir returns the cgroup's directory in the memory hierarchy.
func (g *Group) Dir() string { return g.dir }

// Path returns the cgroup's path relative to the root of a hierarchy, as an
// OCI spec's linux.cgroupsPath names it (sandbox.SetCgroupsPath): runsc
// moves a sandbox into its spec's cgroup (by default "/" + its ID), so a
// sandbox is put in g through its bundle, not with Command.
func (g *Group) Path() string { return g.path }

// Command returns a command that runs name with args inside g: a shell
// moves itself into g, then executes name, so that every process it starts
// is charged to g from its first page, unless it moves itself (runsc
// does). exec.Cmd's CgroupFD would do the same without the shell, but only
// on cgroup v2.
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
// them to go), and on cgroup v1 the same path in every other hierarchy,
// where runsc creates it too for the sandboxes it puts in g.
func (g *Group) Remove() error {
	dirs := []string{g.dir}
	if !g.v2 {
		entries, err := os.ReadDir(Root)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if d := filepath.Join(Root, e.Name(), g.path); e.IsDir() && d != g.dir {
				dirs = append(dirs, d)
			}
		}
	}
	for _, d := range dirs {
		if err := removeDir(d); err != nil {
			return err
		}
		// The shared parent goes once its last group has (an error means
		// that another group is still there).
		os.Remove(filepath.Dir(d))
	}
	return nil
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
