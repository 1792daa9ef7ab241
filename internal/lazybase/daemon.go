package lazybase

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Daemon is a `forkvisor-oci lazyd` process started by Start (for tests and
// benchmarks; a node runs it as a service).
type Daemon struct {
	cmd  *exec.Cmd
	root string
	// Log is the file that receives the daemon's output.
	Log string
	// done is closed when the process has exited.
	done chan struct{}
}

// Start runs `bin --base-store root lazyd` with env added to the
// environment, its output appended to logPath, and waits until its
// filesystem is mounted.
func Start(bin, root string, env []string, logPath string) (*Daemon, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--base-store", root, "lazyd")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &Daemon{cmd: cmd, root: root, Log: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(d.done)
	}()
	mnt := filepath.Join(root, MountDir)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if mounted(mnt) {
			return d, nil
		}
		select {
		case <-d.done:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("lazyd exited before mounting %s: %s", mnt, strings.TrimSpace(string(out)))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Stop()
			return nil, fmt.Errorf("lazyd did not mount %s within 10s", mnt)
		}
	}
}

// mounted reports whether the fetcher's filesystem is mounted at mnt.
func mounted(mnt string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, tail := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(tail) >= 1 && f[4] == mnt && tail[0] == FSType {
			return true
		}
	}
	return false
}

// Stop stops the daemon (SIGTERM, then SIGKILL after 5 s) and makes sure its
// mount is gone.
func (d *Daemon) Stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
	if mnt := filepath.Join(d.root, MountDir); mounted(mnt) {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	}
}

// Fetch is one line of a base's fetch log: a block fetched from the
// registry.
type Fetch struct {
	Block  int    `json:"block"`
	Digest string `json:"digest"`
	Bytes  int64  `json:"bytes"`
	// Ms is how long the fetch took, from StartUnixMicro.
	Ms             int64 `json:"ms"`
	StartUnixMicro int64 `json:"start_unix_us"`
	// Prefetch is true for a fetch that lazyd started ahead of any reader
	// (readers may have waited on it since).
	Prefetch  bool   `json:"prefetch"`
	Reference string `json:"reference"`
}

// FetchLogPath returns the path of the fetch log of base hex in the store
// at root: one JSON Fetch per line.
func FetchLogPath(root, hex string) string {
	return filepath.Join(root, CacheDir, hex, fetchLogName)
}

// Fetches returns the fetch log of base hex in the store at root.
func Fetches(root, hex string) ([]Fetch, error) {
	path := FetchLogPath(root, hex)
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// Every complete line ends with a newline; a last line without one was
	// cut short by a fetcher that stopped while writing it.
	lines := bytes.Split(data, []byte("\n"))
	var out []Fetch
	for _, line := range lines[:len(lines)-1] {
		var e Fetch
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, e)
	}
	return out, nil
}
