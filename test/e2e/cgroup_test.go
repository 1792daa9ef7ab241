package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestHooksStartInRunscCgroup checks where runsc's processes start. Where
// runsc cannot clone the sandbox into its cgroup (cgroup v1, as on this
// machine), it joins the container's cgroup to start the sandbox and the
// gofer there, and leaves it again in the background (patch 0027). The
// sandbox must run in the container's cgroup, and the OCI hooks that runsc
// starts after the sandbox (createRuntime by create, poststart by start) in
// runsc's own, as before: a hook that started while runsc was still on its
// way out would be counted and limited as part of the container.
func TestHooksStartInRunscCgroup(t *testing.T) {
	r, dir := newRoot(t, binary(t, "runsc"))
	bundle := filepath.Join(dir, "bundle")
	if err := sandbox.NewBundle(bundle, tickBin, "-mib", "8", "-interval", "50ms"); err != nil {
		t.Fatal(err)
	}
	hooks := map[string]string{}
	for _, h := range []string{"createRuntime", "poststart"} {
		hooks[h] = filepath.Join(dir, h+".cgroup")
	}
	addHooks(t, bundle, hooks)

	const id = "hooked"
	if _, err := r.RunUntilTick(bundle, id, filepath.Join(dir, "out"), 1, nil); err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := r.SandboxPID(id)
	if err != nil {
		t.Fatal(err)
	}
	sandboxCgroup, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Every hierarchy that runsc manages (cgroup v1 controllers, or the
	// unified hierarchy where it is the only one) must name the container.
	lines := strings.Split(strings.TrimSpace(string(sandboxCgroup)), "\n")
	moved := 0
	for _, line := range lines {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || (f[1] == "" && len(lines) > 1) || strings.HasPrefix(f[1], "name=") {
			continue // the unified hierarchy beside v1 controllers, or a named one
		}
		if !strings.HasSuffix(f[2], "/"+id) {
			t.Errorf("the sandbox (PID %d) is in %q for %q, not in the container's cgroup %q", pid, f[2], f[1], "/"+id)
		}
		moved++
	}
	if moved == 0 {
		t.Errorf("found no cgroup hierarchy of the sandbox (PID %d) to check:\n%s", pid, sandboxCgroup)
	}
	for h, path := range hooks {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%s hook: %v", h, err)
			continue
		}
		if string(got) != string(own) {
			t.Errorf("the %s hook ran in cgroups\n%s\nwant runsc's own (this test's)\n%s", h, got, own)
		}
	}
}

// addHooks adds to the spec of bundle, for each hook name in hooks, a hook
// that writes the cgroups it runs in to the file hooks[name].
func addHooks(t *testing.T, bundle string, hooks map[string]string) {
	t.Helper()
	path := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	h := map[string]any{}
	for name, out := range hooks {
		h[name] = []map[string]any{{"path": "/bin/sh", "args": []string{"sh", "-c", "cat /proc/self/cgroup > " + out}}}
	}
	spec["hooks"] = h
	if b, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
