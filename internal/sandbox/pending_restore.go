package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ErrRestoreNotStarted is the error of PendingRestore.Restore when the image
// path could not be sent because the runsc process had already ended: the
// restore did not start, so the container is as it was before.
var ErrRestoreNotStarted = errors.New("sandbox: the pending runsc restore ended before its image path was sent")

// ErrResumeNotStarted is the error of PendingResume.Resume when the line
// could not be sent because the runsc process had already ended: the
// container was not resumed.
var ErrResumeNotStarted = errors.New("sandbox: the pending runsc resume ended before its line was sent")

// pending is a runsc process started ahead of a request, waiting for one
// line on its standard input (a pipe) that the request sends; only the
// fork's runsc has such commands. It is not safe for concurrent use.
type pending struct {
	d *detached
	// what names the command in errors ("runsc resume of ID").
	what string
	// send is the pipe's write end; nil once the line is sent or the
	// command is cancelled.
	send *os.File
	// done is closed when the runsc process has exited; err is then its
	// error.
	done chan struct{}
	err  error
}

// startPending starts runsc subcommand args, whose line comes from
// /dev/stdin, with its standard output going to outPath.
func (r *Runsc) startPending(outPath string, args ...string) (*pending, error) {
	if r.Upstream {
		return nil, fmt.Errorf("sandbox: upstream runsc cannot start runsc %s of %s before its request", args[0], args[len(args)-1])
	}
	recv, send, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	d, err := r.detachedCommand(outPath, args...)
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
		return nil, fmt.Errorf("starting runsc %s of %s: %w", args[0], args[len(args)-1], err)
	}
	p := &pending{d: d, what: fmt.Sprintf("runsc %s of %s", args[0], args[len(args)-1]), send: send, done: make(chan struct{})}
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
func (p *pending) Pid() int {
	return p.d.cmd.Process.Pid
}

// CPU returns the CPU time that p's runsc process has used: all of it once
// it has exited (CommandCPU), so far while it runs.
func (p *pending) CPU() time.Duration {
	select {
	case <-p.done:
		return CommandCPU(p.d.cmd)
	default:
		st, err := ReadProcStat(p.Pid())
		if err != nil {
			return 0
		}
		return st.CPU + st.ReapedCPU
	}
}

// Waiting reports whether p's runsc process still waits for its line. A
// process may end right after: the send then fails as not started.
func (p *pending) Waiting() bool {
	select {
	case <-p.done:
		return false
	default:
		// done closes only after the process's stderr is read: look at
		// the process itself too.
		return p.send != nil && alive(p.Pid())
	}
}

// sendLine sends line and a newline and waits until the process has exited,
// returning its error. If the process had already ended, the error wraps
// notStarted.
func (p *pending) sendLine(line string, notStarted error) error {
	if p.send == nil {
		return fmt.Errorf("sandbox: the pending %s was already used", p.what)
	}
	select {
	case <-p.done:
		p.send.Close()
		p.send = nil
		return fmt.Errorf("%w: %v", notStarted, p.err)
	default:
	}
	_, werr := p.send.WriteString(line + "\n")
	p.send.Close()
	p.send = nil
	<-p.done
	switch {
	case errors.Is(werr, syscall.EPIPE):
		// Nobody read the line: the process had ended.
		return fmt.Errorf("%w: %v (%v)", notStarted, werr, p.err)
	case werr != nil:
		return fmt.Errorf("sending its line to the pending %s: %w (runsc: %v)", p.what, werr, p.err)
	}
	return p.err
}

// WaitReading waits until p's runsc process has opened its line's file, a
// second descriptor of its standard input (it has done its checks by then
// and waits for the line), or has exited, and returns the process's error
// in that case.
func (p *pending) WaitReading(timeout time.Duration) error {
	fdDir := fmt.Sprintf("/proc/%d/fd", p.Pid())
	for deadline := time.Now().Add(timeout); ; time.Sleep(2 * time.Millisecond) {
		select {
		case <-p.done:
			if p.err == nil {
				return fmt.Errorf("the pending %s exited before its line", p.what)
			}
			return p.err
		default:
		}
		if stdin, err := os.Readlink(filepath.Join(fdDir, "0")); err == nil {
			n := 0
			if ents, err := os.ReadDir(fdDir); err == nil {
				for _, e := range ents {
					if l, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && l == stdin {
						n++
					}
				}
			}
			if n > 1 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pending %s did not start reading its line within %v", p.what, timeout)
		}
	}
}

// Cancel closes the pipe without a line, which ends the runsc process with
// an error and leaves the container as it was, waits for it to exit and
// returns that error (nil if the line was already sent).
func (p *pending) Cancel() error {
	if p.send == nil {
		<-p.done
		return nil
	}
	p.send.Close()
	p.send = nil
	<-p.done
	return p.err
}

// PendingRestore is a `runsc restore --image-path-from` of a created
// container, started before its image is known: the runsc process has
// started and waits for the image path on a pipe, so that a restore on
// request skips runsc's own start. A PendingRestore is not safe for
// concurrent use.
type PendingRestore struct {
	*pending
}

// StartRestore starts `runsc restore --image-path-from` of container id,
// which must have been created from bundle (Create), with extra restore
// flags; the container's output keeps going to outPath. The process waits
// for Restore or Cancel.
func (r *Runsc) StartRestore(bundle, id, outPath string, extra ...string) (*PendingRestore, error) {
	args := append([]string{"restore", "--image-path-from=/dev/stdin", "--bundle", bundle, "--detach"}, extra...)
	p, err := r.startPending(outPath, append(args, id)...)
	if err != nil {
		return nil, err
	}
	return &PendingRestore{p}, nil
}

// Restore sends the image path (made absolute) and waits until runsc
// restore has exited, returning its error. If the process had already
// ended, the error wraps ErrRestoreNotStarted.
func (p *PendingRestore) Restore(image string) error {
	abs, err := filepath.Abs(image)
	if err != nil {
		p.Cancel()
		return err
	}
	return p.sendLine(abs, ErrRestoreNotStarted)
}

// PendingResume is a `runsc resume --wait-line-from` of a paused container
// (one restored with restore --paused, or paused by runsc pause), started
// before the request to resume it: the runsc process has started, checked
// that the container is paused and waits for its ID on a pipe. A
// PendingResume is not safe for concurrent use.
type PendingResume struct {
	*pending
	id string
}

// StartResume starts `runsc resume --wait-line-from` of paused container
// id, whose full ID it must be, and returns once the process waits for its
// line: it has checked that the container is paused by then, and fails
// otherwise. Its output goes to outPath. The process waits for Resume or
// Cancel.
func (r *Runsc) StartResume(id, outPath string) (*PendingResume, error) {
	p, err := r.startPending(outPath, "resume", "--wait-line-from=/dev/stdin", id)
	if err != nil {
		return nil, err
	}
	if err := p.WaitReading(30 * time.Second); err != nil {
		p.Cancel()
		return nil, err
	}
	return &PendingResume{p, id}, nil
}

// Resume sends the container's ID and waits until runsc resume has exited,
// returning its error. If the process had already ended, the error wraps
// ErrResumeNotStarted.
func (p *PendingResume) Resume() error {
	return p.sendLine(p.id, ErrResumeNotStarted)
}
