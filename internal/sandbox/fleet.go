package sandbox

import (
	"bytes"
	"fmt"
	"os"
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

// writeSetMagic starts a complete base write set (pgalloc's encoding); the
// restore that learns it creates the file empty and writes it whole.
var writeSetMagic = []byte("GVWRSET\x00")

// WaitWriteSet waits up to timeout until the base write set at path (e.g.
// IMAGE/base.writeset) has been written by the restore that learns it.
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
