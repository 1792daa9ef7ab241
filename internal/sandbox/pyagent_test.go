package sandbox

import (
	"encoding/json"
	"github.com/forkvisor/forkvisor/internal/prereq"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestPyAgentArgs(t *testing.T) {
	for _, tc := range []struct {
		entries  int
		interval time.Duration
		extra    []string
		want     []string
	}{
		{200000, 100 * time.Millisecond, nil,
			[]string{"/usr/bin/python3", "/opt/agent.py", "--entries", "200000", "--interval", "0.1"}},
		{1000, 50 * time.Millisecond, []string{"--seed", "7"},
			[]string{"/usr/bin/python3", "/opt/agent.py", "--entries", "1000", "--interval", "0.05", "--seed", "7"}},
		{1, 2 * time.Second, nil,
			[]string{"/usr/bin/python3", "/opt/agent.py", "--entries", "1", "--interval", "2"}},
		{10, 1500 * time.Microsecond, nil,
			[]string{"/usr/bin/python3", "/opt/agent.py", "--entries", "10", "--interval", "0.0015"}},
	} {
		if got := PyAgentArgs(tc.entries, tc.interval, tc.extra...); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("PyAgentArgs(%d, %v, %q) = %q, want %q", tc.entries, tc.interval, tc.extra, got, tc.want)
		}
	}
}

// fakeRepo makes a repository root with agent.py and, unless stage says
// otherwise, a complete-looking build/pyrootfs.
func fakeRepo(t *testing.T, stage string) string {
	t.Helper()
	repo := t.TempDir()
	mk := func(rel string, data string, mode os.FileMode) {
		p := filepath.Join(repo, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	mk(PyAgentScript, "print('agent')\n", 0o644)
	if stage == "missing" {
		return repo
	}
	rootfs := filepath.Join(repo, PyRootfsDir)
	mk(PyRootfsDir+"/usr/bin/python3.11", "#!/bin/false\n", 0o755)
	if stage != "no-python" {
		if err := os.Symlink("python3.11", filepath.Join(rootfs, "usr/bin/python3")); err != nil {
			t.Fatal(err)
		}
	}
	if stage != "no-stamp" {
		mk(PyRootfsDir+"/"+pyRootfsStamp, "0123abcd\n", 0o644)
	}
	if stage != "no-opt" {
		if err := os.MkdirAll(filepath.Join(rootfs, "opt"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}

func TestPyRootfs(t *testing.T) {
	for _, tc := range []struct {
		stage string
		want  string // "" for success
	}{
		{"complete", ""},
		{"missing", "no Python rootfs"},
		{"no-stamp", "incomplete"},
		{"no-python", "no executable /usr/bin/python3"},
		{"no-opt", "no /opt directory"},
	} {
		t.Run(tc.stage, func(t *testing.T) {
			repo := fakeRepo(t, tc.stage)
			dir, err := PyRootfs(repo)
			if tc.want == "" {
				if err != nil || dir != filepath.Join(repo, PyRootfsDir) {
					t.Fatalf("PyRootfs = %q, %v; want %q", dir, err, filepath.Join(repo, PyRootfsDir))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "tools/pyrootfs.sh") {
				t.Fatalf("PyRootfs: %v; want an error containing %q that names tools/pyrootfs.sh", err, tc.want)
			}
		})
	}
}

func TestNewPyAgentBundle(t *testing.T) {
	repo := fakeRepo(t, "complete")
	bundle := filepath.Join(t.TempDir(), "bundle")
	if err := NewPyAgentBundle(bundle, repo, 1000, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(bundle, "pyagent", "agent.py")); err != nil || string(b) != "print('agent')\n" {
		t.Errorf("agent copy: %q, %v", b, err)
	}
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Process struct{ Args []string }
		Root    struct {
			Path     string
			Readonly bool
		}
		Mounts []struct {
			Destination, Type, Source string
			Options                   []string
		}
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Root.Path != filepath.Join(repo, PyRootfsDir) || !spec.Root.Readonly {
		t.Errorf("root = %+v; want %s read-only", spec.Root, filepath.Join(repo, PyRootfsDir))
	}
	if want := PyAgentArgs(1000, 20*time.Millisecond); !reflect.DeepEqual(spec.Process.Args, want) {
		t.Errorf("args = %q, want %q", spec.Process.Args, want)
	}
	mounts := map[string]string{}
	for _, m := range spec.Mounts {
		mounts[m.Destination] = m.Type + " " + m.Source + " " + strings.Join(m.Options, ",")
	}
	if got, want := mounts["/opt"], "bind "+filepath.Join(bundle, "pyagent")+" rbind,ro"; got != want {
		t.Errorf("/opt mount = %q, want %q", got, want)
	}
	if !strings.HasPrefix(mounts["/tmp"], "tmpfs ") {
		t.Errorf("/tmp mount = %q, want a tmpfs", mounts["/tmp"])
	}

	if err := NewPyAgentBundle(filepath.Join(t.TempDir(), "b2"), fakeRepo(t, "missing"), 10, time.Second); err == nil ||
		!strings.Contains(err.Error(), "tools/pyrootfs.sh") {
		t.Errorf("bundle without a rootfs: %v; want an error naming tools/pyrootfs.sh", err)
	}
}

// TestPyAgentOnHost runs agent.py with the host's python3 (outside any
// sandbox): its lines parse as ticks, the checksum holds, and the mark and
// dump commands work through the command file.
func TestPyAgentOnHost(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		prereq.Missing(t, "no python3 on this host")
	}
	script, err := filepath.Abs(filepath.Join("..", "..", PyAgentScript))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctl, dump, out := filepath.Join(dir, "ctl"), filepath.Join(dir, "dump"), filepath.Join(dir, "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(py, script, "--entries", "2000", "--interval", "0.01", "--ctl", ctl, "--dump", dump)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	send := func(c string) {
		t.Helper()
		if b, err := exec.Command(py, script, "--ctl", ctl, "--send", c).CombinedOutput(); err != nil {
			t.Fatalf("--send %s: %v: %s", c, err, b)
		}
	}
	wait := func(what string, match func(Tick) bool) {
		t.Helper()
		if _, _, err := WaitForLine(out, 0, 30*time.Second, func(l string) bool {
			tk, err := ParseTick(l)
			return err == nil && match(tk)
		}); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	wait("tick 2", func(tk Tick) bool { return tk.N >= 2 })
	if lines := Lines(out); !strings.HasPrefix(lines[0], "pyagent entries=2000 ") {
		t.Errorf("first line %q; want the pyagent start line", lines[0])
	}
	send("mark")
	var mark string
	wait("a mark", func(tk Tick) bool { mark = tk.Mark; return tk.Mark != "0" })
	send("dump")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(dump); err == nil {
			if tk, err := ParseTick(string(b)); err != nil || tk.Mark != mark || !tk.OK {
				t.Errorf("dump %q: %+v, %v; want sum=ok mark=%s", b, tk, err, mark)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no dump")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, l := range Lines(out)[1:] {
		tk, err := ParseTick(l)
		if err != nil || !tk.OK || tk.PassMs <= 0 {
			t.Errorf("line %q: %+v, %v; want a tick with sum=ok and the pass's time", l, tk, err)
		}
	}
}
