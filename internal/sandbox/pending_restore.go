package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrRestoreNotStarted is the error of PendingRestore.Restore when the image
// path could not be sent because the runsc process had already ended: the
// restore did not start, so the container is as it was before.
var ErrRestoreNotStarted = errors.New("sandbox: the pending runsc restore ended before its image path was sent")

// PendingRestore is a `runsc restore --image-path-from` of a created
// container, started before its image is known: the runsc process has
// started and waits for the image path on a pipe, so that a restore on
// request skips runsc's own start. Only the fork's runsc has the flag. A
// PendingRestore is not safe for concurrent use.
type PendingRestore struct {
	d *detached
	// send is the pipe's write end; nil once the image path is sent or the
	// restore is cancelled.
	send *os.File
	// done is closed when the runsc process has exited; err is then its
	// error.
	done chan struct{}
	err  error
}

// StartRestore starts `runsc restore --image-path-from` of container id,
// which must have been created from bundle (Create), with extra restore
// flags; the container's output keeps going to outPath. The process waits
// for Restore or Cancel.
func (r *Runsc) StartRestore(bundle, id, outPath string, extra ...string) (*PendingRestore, error) {
	if r.Upstream {
		return nil, errors.New("sandbox: upstream runsc has no restore --image-path-from")
	}
	recv, send, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	args := append([]string{"restore", "--image-path-from=/dev/stdin", "--bundle", bundle, "--detach"}, extra...)
	d, err := r.detachedCommand(outPath, append(args, id)...)
	if err != nil {
		recv.Close()
		send.Close()
		return nil, err
	}
	d.cmd.Stdin = recv
	err = d.cmd.Start()
	recv.Close()
	// The child has its own descriptors of the output files; errf is read
	// by name if the process fails.
	d.close(false)
	if err != nil {
		send.Close()
		os.Remove(d.errf.Name())
		return nil, fmt.Errorf("starting runsc restore of %s: %w", id, err)
	}
	p := &PendingRestore{d: d, send: send, done: make(chan struct{})}
	go func() {
		err := d.cmd.Wait()
		if err != nil {
			p.err = d.failed(err)
		}
		close(p.done)
		os.Remove(d.errf.Name())
	}()
	return p, nil
}

// Pid returns the PID of p's runsc process.
func (p *PendingRestore) Pid() int {
	return p.d.cmd.Process.Pid
}

// Waiting reports whether p's runsc process still waits for its image. A
// process may end right after: Restore then fails with
// ErrRestoreNotStarted.
func (p *PendingRestore) Waiting() bool {
	select {
	case <-p.done:
		return false
	default:
		// done closes only after the process's stderr is read: look at
		// the process itself too.
		return p.send != nil && alive(p.Pid())
	}
}

// Restore sends the image path (made absolute) and waits until runsc
// restore has exited, returning its error. If the process had already
// ended, the error wraps ErrRestoreNotStarted.
func (p *PendingRestore) Restore(image string) error {
	if p.send == nil {
		return errors.New("sandbox: the pending restore was already used")
	}
	abs, err := filepath.Abs(image)
	if err != nil {
		p.Cancel()
		return err
	}
	select {
	case <-p.done:
		p.send.Close()
		p.send = nil
		return fmt.Errorf("%w: %v", ErrRestoreNotStarted, p.err)
	default:
	}
	_, werr := p.send.WriteString(abs + "\n")
	p.send.Close()
	p.send = nil
	<-p.done
	switch {
	case errors.Is(werr, syscall.EPIPE):
		// Nobody read the line: the process had ended.
		return fmt.Errorf("%w: %v (%v)", ErrRestoreNotStarted, werr, p.err)
	case werr != nil:
		return fmt.Errorf("sending the image path to runsc restore: %w (runsc: %v)", werr, p.err)
	}
	return p.err
}

// Cancel closes the pipe without an image path, which ends the runsc
// process with an error and leaves the container as it was, waits for it to
// exit and returns that error (nil if it was already used by Restore).
func (p *PendingRestore) Cancel() error {
	if p.send == nil {
		<-p.done
		return nil
	}
	p.send.Close()
	p.send = nil
	<-p.done
	return p.err
}
