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

// FleetMemory is the memory of a set of sandboxes, summed.
type FleetMemory struct {
	// All is every process of the sandboxes (sentry, systrap stubs, gofer;
	// each address space once), Sentries their sentries alone; both with
	// the MemoryFile pages that no process maps as Unmapped (Total is the
	// memory they hold).
	All, Sentries memstat.Usage

	// ByKind is All's memory, in KiB, by kind (memstat.KindGuest, ...), the
	// unmapped pages in KindGuest.
	ByKind map[string]uint64
}

// Memory returns the memory of containers ids, each its own sandbox
// (memstat.OfSandbox), summed.
func (r *Runsc) Memory(ids ...string) (FleetMemory, error) {
	m := FleetMemory{ByKind: map[string]uint64{}}
	for _, id := range ids {
		pid, err := r.SandboxPID(id)
		if err != nil {
			return FleetMemory{}, err
		}
		sb, err := memstat.OfSandbox(pid, r.GoferPID(id))
		if err != nil {
			return FleetMemory{}, fmt.Errorf("container %s: %w", id, err)
		}
		m.All.Add(sb.All)
		m.Sentries.Add(sb.Sentry)
		for kind, v := range sb.ByKind {
			m.ByKind[kind] += v
		}
	}
	return m, nil
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
