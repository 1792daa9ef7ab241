package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// Memory returns the memory of containers ids (each its own sandbox), summed:
// all their processes (sentry, systrap stubs, gofer; each address space once)
// and their sentries alone, with their MemoryFile pages that no process maps
// as Unmapped (memstat.OfSandbox; Usage.Total is the memory they hold).
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

// MemoryByKind returns the memory, in KiB, of containers ids (each its own
// sandbox; all their processes, each address space once) by kind
// (memstat.KindGuest, KindBase, ...), and the part of KindGuest that is
// MemoryFile pages no process maps (memstat.Breakdown), summed.
func (r *Runsc) MemoryByKind(ids ...string) (byKind map[string]uint64, unmapped uint64, err error) {
	byKind = map[string]uint64{}
	for _, id := range ids {
		pid, err := r.SandboxPID(id)
		if err != nil {
			return nil, 0, err
		}
		k, u, err := memstat.Breakdown(memstat.SandboxPIDs(pid, r.GoferPID(id)))
		if err != nil {
			return nil, 0, fmt.Errorf("container %s: %w", id, err)
		}
		for kind, v := range k {
			byKind[kind] += v
		}
		unmapped += u
	}
	return byKind, unmapped, nil
}

// WriteSetPath returns where the fork keeps the write set of the base that
// the checkpoint in image was saved against (writeset.Path, with the base's
// entry in r's node base store).
func (r *Runsc) WriteSetPath(image string) string {
	b, err := os.ReadFile(filepath.Join(image, "base.json"))
	if err != nil {
		return writeset.Path(image, "")
	}
	var d struct {
		SHA256 string `json:"sha256"`
	}
	if json.Unmarshal(b, &d) != nil || d.SHA256 == "" {
		return writeset.Path(image, "")
	}
	return writeset.Path(image, r.StoreEntry(d.SHA256))
}

// WaitWriteSet waits up to timeout until the base write set at path (see
// WriteSetPath) has been written by the restore that learns it.
func WaitWriteSet(path string, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil && writeset.Complete(b) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no write set written to %s within %v", path, timeout)
		}
	}
}
