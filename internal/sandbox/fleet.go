package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
)

// Memory returns the memory of containers ids (each its own sandbox), summed:
// all their processes (sentry, systrap stubs, gofer; each address space once)
// and their sentries alone.
func (r *Runsc) Memory(ids ...string) (all, sentries memstat.Usage, err error) {
	for _, id := range ids {
		pid, err := r.SandboxPID(id)
		if err != nil {
			return all, sentries, err
		}
		m, err := memstat.OfSandbox(pid, r.GoferPID(id))
		if err != nil {
			return all, sentries, fmt.Errorf("container %s: %w", id, err)
		}
		all.Add(m.All)
		sentries.Add(m.Sentry)
	}
	return all, sentries, nil
}

// MemoryByKind returns the total Pss, in KiB, of containers ids (each its
// own sandbox; all their processes, each address space once) by kind of
// memory (memstat.KindGuest, KindBase, ...).
func (r *Runsc) MemoryByKind(ids ...string) (map[string]uint64, error) {
	total := map[string]uint64{}
	for _, id := range ids {
		pid, err := r.SandboxPID(id)
		if err != nil {
			return nil, err
		}
		byKind, err := memstat.Breakdown(memstat.SandboxPIDs(pid, r.GoferPID(id)))
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", id, err)
		}
		for k, v := range byKind {
			total[k] += v
		}
	}
	return total, nil
}

// writeSetMagic starts a complete base write set (pgalloc's encoding); the
// restore that learns it creates the file empty and writes it whole.
var writeSetMagic = []byte("GVWRSET\x00")

// WriteSetPath returns where the fork keeps the write set of the base that
// the checkpoint in image was saved against: in the node base store's entry
// when a restore maps the stored file (the image links it, or holds no
// base.img), else beside the image's base.img.
func (r *Runsc) WriteSetPath(image string) string {
	beside := filepath.Join(image, "base.writeset")
	b, err := os.ReadFile(filepath.Join(image, "base.json"))
	if err != nil {
		return beside
	}
	var d struct {
		SHA256 string `json:"sha256"`
	}
	if json.Unmarshal(b, &d) != nil || d.SHA256 == "" {
		return beside
	}
	entry := r.StoreEntry(d.SHA256)
	stored, err := os.Stat(filepath.Join(entry, "base.img"))
	if err != nil {
		return beside
	}
	if own, err := os.Stat(filepath.Join(image, "base.img")); err == nil && !os.SameFile(own, stored) {
		return beside
	}
	return filepath.Join(entry, "base.writeset")
}

// WaitWriteSet waits up to timeout until the base write set at path (see
// WriteSetPath) has been written by the restore that learns it.
func WaitWriteSet(path string, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil && bytes.HasPrefix(b, writeSetMagic) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no write set written to %s within %v", path, timeout)
		}
	}
}
