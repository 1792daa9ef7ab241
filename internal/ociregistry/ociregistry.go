// Package ociregistry runs a real OCI registry for tests and benchmarks:
// Debian's docker-registry (the CNCF distribution registry 2.8, unpacked
// under build/registry by tools/registry.sh), on loopback only, with its own
// storage directory, optionally behind htpasswd basic authentication.
package ociregistry

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/forkvisor/forkvisor/internal/prereq"
)

// Binary returns where tools/registry.sh puts the registry under repoRoot.
func Binary(repoRoot string) string {
	return filepath.Join(repoRoot, "build", "registry", "usr", "bin", "docker-registry")
}

// StartForTest starts the registry that tools/registry.sh unpacked under
// repoRoot for t (see Start), stopped when t ends; a missing registry is a
// missing prerequisite (prereq.Missing).
func StartForTest(t testing.TB, repoRoot, user, password string) *Registry {
	t.Helper()
	bin := Binary(repoRoot)
	if _, err := os.Stat(bin); err != nil {
		prereq.Missing(t, "no OCI registry (run tools/setup.sh): %v", err)
	}
	reg, err := Start(bin, t.TempDir(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	return reg
}

// Registry is a running registry.
type Registry struct {
	// Addr is host:port on loopback.
	Addr string
	// Storage is the registry's storage directory (filesystem driver).
	Storage string
	// User and Password are the credentials it requires, if any.
	User, Password string

	cmd *exec.Cmd
	log *os.File
}

// Start starts the registry bin with its files under dir. If user is not
// empty, it requires basic authentication as user:password. Deleting is
// disabled, as on most registries by default.
func Start(bin, dir, user, password string) (*Registry, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("registry binary: %w (run tools/registry.sh)", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &Registry{Addr: fmt.Sprintf("127.0.0.1:%d", port), Storage: filepath.Join(dir, "storage"), User: user, Password: password}
	auth := ""
	if user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			return nil, err
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
			return nil, err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: forkvisor-test\n    path: %s\n", htpasswd)
	}
	config := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: false
http:
  addr: %s
%s`, r.Storage, r.Addr, auth)
	configPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		return nil, err
	}
	r.log, err = os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, err
	}
	r.cmd = exec.Command(bin, "serve", configPath)
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	if err := r.cmd.Start(); err != nil {
		r.log.Close()
		return nil, err
	}
	deadline := time.Now().Add(15 * time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get("http://" + r.Addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return r, nil
			}
		}
		if time.Now().After(deadline) {
			r.Stop()
			out, _ := os.ReadFile(r.log.Name())
			return nil, fmt.Errorf("registry on %s did not answer: %v\n%s", r.Addr, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the registry (its storage stays).
func (r *Registry) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
	if r.log != nil {
		r.log.Close()
	}
}

// WriteDockerConfig writes dir/config.json holding r's credentials, for
// DOCKER_CONFIG=dir.
func (r *Registry) WriteDockerConfig(dir string) error {
	cfg := map[string]any{"auths": map[string]any{
		r.Addr: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(r.User + ":" + r.Password))},
	}}
	data, _ := json.Marshal(cfg)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600)
}

// BlobPath returns where the registry stores the blob with digest
// "sha256:<hex>" (the filesystem driver's layout).
func (r *Registry) BlobPath(digest string) string {
	hex := strings.TrimPrefix(digest, "sha256:")
	return filepath.Join(r.Storage, "docker", "registry", "v2", "blobs", "sha256", hex[:2], hex, "data")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
