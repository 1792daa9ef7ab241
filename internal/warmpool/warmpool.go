// Package warmpool keeps runsc sandboxes started and waiting for an image,
// so that a restore skips everything that does not depend on the image; or,
// bound to one image, keeps clones of it restored and paused, so that a
// restore is only a resume.
//
// A waiting sandbox is a container created with `runsc create` and never
// started: its sandbox and gofer processes, namespaces, platform and control
// server exist, and the sentry waits for a start or a restore (which
// installs the seccomp filter, since the filter depends on the image).
// `runsc restore --image-path IMAGE ID` of such a container sends only the
// image (runsc's own interface: restore into a created container, as
// containerd does); the pool adds the keeping and the refilling.
//
// What a waiting sandbox is bound to, fixed at create: the bundle (the OCI
// spec: process, environment, root filesystem, mounts), the network
// namespace and cgroup the spec names, runsc's flags (platform, network
// mode, overlay, base store) and the container ID. What the image brings:
// the kernel state and memory. runsc refuses an image saved from a
// container whose spec differs (restore spec validation names the field),
// and the sandbox it was given is then used up: the pool destroys and
// replaces it.
//
// A pool made by NewPrespawned also starts, for each waiting sandbox, its
// `runsc restore --image-path-from` (fork's runsc only), with the flags given
// to NewPrespawned: the runsc process has started and waits for the image
// path on a pipe, and Restore sends it. runsc's own start (about as long as
// the sandbox's part of a small restore on 2 CPUs) is then off the request
// path as well; each waiting sandbox costs one more idle runsc process. A
// waiting sandbox whose restore process died is destroyed and replaced like
// one whose sandbox died; if the process dies after Restore took its sandbox
// but before it read the path, Restore restores into that sandbox with a
// runsc restore of its own.
//
// A pool made by NewRestored is bound to one image as well: each waiting
// sandbox is a clone restored from it with `runsc restore --paused` (its
// kernel state decoded, its memory mapped or copied, its new identity and
// restore signal given, its tasks not yet run), and Restore of that image
// is `runsc resume`. What the image brings is then fixed at refill too, so
// Restore of any other image path is refused (ErrOtherImage), naming both;
// the image must not change while the pool lives (the pool knows it by its
// path, not its content). A waiting clone holds the memory a restored clone
// holds before it runs (with a shared base: the pages of the base's write
// set it copied, and its share of the base). The time a clone waits passes
// on its clocks, as for `runsc pause`: timers that expired meanwhile fire
// together when it is resumed.
//
// A pool made by NewRestoredPrespawned is one made by NewRestored whose
// clones each have their `runsc resume --wait-line-from` started too (fork's
// runsc only), and waiting for its line before the clone counts as waiting:
// Restore sends the clone's ID on a pipe, so that no runsc process starts on
// the request path at all. A clone whose resume process died is destroyed
// and replaced; if that resume fails once Restore took the clone (its
// process died meanwhile, say) and the clone is still paused, Restore
// resumes it with a runsc resume of its own.
//
// A pool refills RefillDelay after a request has been served (its `runsc
// restore` or `runsc resume` returned), and starts no refill while a
// request is in progress, so that the refill competes neither with the
// restore it replaces nor with the served clone's first moments; under
// requests that keep coming, it defers a refill for at most one second. A
// burst of requests larger than the pool creates the rest synchronously.
package warmpool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// ErrOtherImage is the error of Restore from a pool of paused clones of
// another image.
var ErrOtherImage = errors.New("warmpool: the pool holds paused clones of another image")

// Sandbox is a sandbox handed out by Restore; it belongs to the caller.
type Sandbox struct {
	// ID is the container ID, chosen when it was created.
	ID string
	// Out receives the container's output.
	Out string

	// restore, in a pool made by NewPrespawned, is the sandbox's runsc
	// restore waiting for its image; nil once handed out.
	restore *sandbox.PendingRestore
	// resume, in a pool made by NewRestoredPrespawned, is the paused
	// clone's runsc resume waiting for its line; nil once handed out.
	resume *sandbox.PendingResume

	// Prespawned is set on a sandbox handed out by Restore of a pool made
	// by NewPrespawned or NewRestoredPrespawned if its prespawned runsc
	// process served the request (not a runsc started by Restore).
	Prespawned bool
}

// Pool keeps Size sandboxes of one bundle waiting.
type Pool struct {
	r      *sandbox.Runsc
	bundle string
	dir    string
	prefix string
	size   int
	// image, if not empty, is the checkpoint that the waiting sandboxes
	// are restored (paused) from, with restoreArgs (NewRestored).
	image       string
	restoreArgs []string
	// prespawn: each waiting sandbox has a runsc restore waiting for its
	// image, started with restoreArgs (NewPrespawned), or, with image set,
	// a runsc resume waiting for its line (NewRestoredPrespawned).
	prespawn bool

	mu sync.Mutex
	// cond is signalled when waiting grows, when a refill fails, and when
	// the pool closes.
	cond sync.Cond
	// waiting are created sandboxes not handed out yet, oldest first.
	waiting []Sandbox
	// next numbers container IDs.
	next int
	// attempts counts the refiller's creates; lastErr is the error of the
	// latest one (nil if it succeeded).
	attempts uint64
	lastErr  error
	closed   bool
	// serving counts Restore calls in progress (from before they take a
	// sandbox until they return); servedAt is when the latest one returned,
	// failed or not. The refiller starts a create only when serving is 0
	// and RefillDelay has passed since servedAt, whatever woke it, or once
	// it has deferred for maxRefillDeferral (refillWaitLocked).
	// deferredSince is when the current deferral began (zero if none).
	serving       int
	servedAt      time.Time
	deferredSince time.Time
	// refill wakes the refiller; stop ends it, and done is closed when it
	// has ended.
	refill chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

// New creates a pool of size sandboxes of bundle under r, named prefix-NNNNNN (a number of six digits),
// with their output in dir, and returns once they all wait.
func New(r *sandbox.Runsc, bundle, dir, prefix string, size int) (*Pool, error) {
	return newPool(&Pool{r: r, bundle: bundle, dir: dir, prefix: prefix, size: size})
}

// NewPrespawned is New, and starts for each waiting sandbox a `runsc
// restore --image-path-from` of it with the extra flags, so that Restore only
// sends the image path (see the package comment). r must be the fork's runsc.
func NewPrespawned(r *sandbox.Runsc, bundle, dir, prefix string, size int, extra ...string) (*Pool, error) {
	if r.Upstream {
		return nil, fmt.Errorf("warmpool: upstream runsc cannot start a restore before its image is known (restore --image-path-from)")
	}
	return newPool(&Pool{r: r, bundle: bundle, dir: dir, prefix: prefix, size: size, prespawn: true, restoreArgs: slices.Clone(extra)})
}

// NewRestored creates a pool of size clones of the checkpoint in image,
// restored into bundle paused (extra flags go to runsc restore), named
// prefix-NNNNNN with their output in dir, and returns once they all wait.
// Restore of image resumes one of them.
func NewRestored(r *sandbox.Runsc, bundle, image, dir, prefix string, size int, extra ...string) (*Pool, error) {
	return newRestored(&Pool{r: r, bundle: bundle, dir: dir, prefix: prefix, size: size, restoreArgs: slices.Clone(extra)}, image)
}

// newRestored makes p a pool of paused clones of image (NewRestored,
// NewRestoredPrespawned).
func newRestored(p *Pool, image string) (*Pool, error) {
	if image == "" {
		return nil, fmt.Errorf("warmpool: no image to restore the pool from")
	}
	abs, err := filepath.Abs(image)
	if err != nil {
		return nil, fmt.Errorf("warmpool: %w", err)
	}
	p.image = abs
	return newPool(p)
}

// NewRestoredPrespawned is NewRestored, and starts for each paused clone a
// `runsc resume --wait-line-from` of it, so that Restore only sends a line
// (see the package comment). r must be the fork's runsc.
func NewRestoredPrespawned(r *sandbox.Runsc, bundle, image, dir, prefix string, size int, extra ...string) (*Pool, error) {
	if r.Upstream {
		return nil, fmt.Errorf("warmpool: upstream runsc cannot start a resume before its request (resume --wait-line-from)")
	}
	return newRestored(&Pool{r: r, bundle: bundle, dir: dir, prefix: prefix, size: size, restoreArgs: slices.Clone(extra), prespawn: true}, image)
}

func newPool(p *Pool) (*Pool, error) {
	if p.size < 1 {
		return nil, fmt.Errorf("warmpool: size %d, want at least 1", p.size)
	}
	p.refill, p.stop, p.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	p.cond.L = &p.mu
	go p.refiller()
	if err := p.Fill(time.Minute); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Fill waits until size sandboxes wait, or a create started after the call
// fails, or timeout passes.
func (p *Pool) Fill(timeout time.Duration) error {
	p.mu.Lock()
	since := p.attempts
	p.mu.Unlock()
	p.kick()
	deadline := time.AfterFunc(timeout, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer deadline.Stop()
	start := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.waiting) < p.size {
		if p.closed {
			return errors.New("warmpool: closed")
		}
		if p.lastErr != nil && p.attempts > since {
			return p.lastErr
		}
		if time.Since(start) >= timeout {
			return fmt.Errorf("warmpool: %d of %d sandboxes waiting after %v", len(p.waiting), p.size, timeout)
		}
		p.cond.Wait()
	}
	return nil
}

// Waiting returns the IDs of the sandboxes that wait now.
func (p *Pool) Waiting() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, len(p.waiting))
	for i, s := range p.waiting {
		ids[i] = s.ID
	}
	return ids
}

// Restore restores the checkpoint in image into a waiting sandbox and hands
// it out; extra flags go to runsc restore. Waiting sandboxes that died are
// destroyed and replaced; if none is left, one is created now. A failed
// restore uses up its sandbox, which is destroyed.
//
// In a pool made by NewRestored, image must be the pool's, extra must be
// empty (the flags were given to NewRestored), and the waiting clone is
// resumed. In a pool made by NewPrespawned, extra must be empty too (the
// flags were given to NewPrespawned).
func (p *Pool) Restore(image string, extra ...string) (Sandbox, error) {
	if p.image != "" {
		abs, err := filepath.Abs(image)
		if err != nil {
			return Sandbox{}, fmt.Errorf("warmpool: %w", err)
		}
		if abs != p.image {
			return Sandbox{}, fmt.Errorf("%w: %s, not %s", ErrOtherImage, p.image, abs)
		}
		if len(extra) != 0 {
			return Sandbox{}, fmt.Errorf("warmpool: restore flags %q: a pool of paused clones takes its flags when it is made", extra)
		}
	}
	if p.prespawn && len(extra) != 0 {
		return Sandbox{}, fmt.Errorf("warmpool: restore flags %q: a pool of prespawned restores takes its flags when it is made", extra)
	}
	// Refill once this request is served (see the package comment and
	// refillWaitLocked).
	p.mu.Lock()
	p.serving++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.serving--
		p.servedAt = time.Now()
		p.mu.Unlock()
		p.kick()
	}()
	s, err := p.take()
	if err != nil {
		return Sandbox{}, err
	}
	if p.image != "" {
		var err error
		if s.resume != nil {
			pending := s.resume
			s.resume = nil
			err = pending.Resume()
			s.Prespawned = err == nil
			if err != nil && p.r.Paused(s.ID) {
				// Its runsc process failed without resuming the clone
				// (it ended after take looked, say): a resume of its
				// own does not use anything up.
				err = p.r.Resume(s.ID)
			}
		} else {
			err = p.r.Resume(s.ID)
		}
		if err != nil {
			p.r.Destroy(s.ID)
			os.Remove(s.Out)
			return Sandbox{}, fmt.Errorf("warmpool: resuming paused clone %s of %s: %w", s.ID, image, err)
		}
		return s, nil
	}
	if s.restore != nil {
		pending := s.restore
		s.restore = nil
		err = pending.Restore(image)
		s.Prespawned = err == nil
		if errors.Is(err, sandbox.ErrRestoreNotStarted) && p.r.Waiting(s.ID) {
			// Its runsc process ended after take looked (killed, say),
			// before it read the path: the sandbox still waits, so
			// restore into it the plain way.
			err = p.r.Restore(p.bundle, s.ID, image, s.Out, p.restoreArgs...)
		}
	} else {
		err = p.r.Restore(p.bundle, s.ID, image, s.Out, extra...)
	}
	if err != nil {
		p.r.Destroy(s.ID)
		os.Remove(s.Out)
		return Sandbox{}, fmt.Errorf("warmpool: restoring %s into waiting sandbox %s: %w", image, s.ID, err)
	}
	return s, nil
}

// take removes a live waiting sandbox from the pool, or creates one if none
// is left. The caller asks for a refill.
func (p *Pool) take() (Sandbox, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return Sandbox{}, errors.New("warmpool: closed")
		}
		if len(p.waiting) == 0 {
			p.mu.Unlock()
			return p.create()
		}
		s := p.waiting[0]
		p.waiting = p.waiting[1:]
		p.mu.Unlock()
		if p.live(s) {
			return s, nil
		}
		// Killed or stopped while it waited: replace it.
		p.discard(s)
	}
}

// live reports whether waiting sandbox s can still be handed out.
func (p *Pool) live(s Sandbox) bool {
	if p.image != "" {
		if s.resume != nil && !s.resume.Waiting() {
			return false
		}
		return p.r.Paused(s.ID)
	}
	if s.restore != nil && !s.restore.Waiting() {
		return false
	}
	return p.r.Waiting(s.ID)
}

// discard ends a waiting sandbox that is not handed out: its pending
// restore or resume, if any, then the sandbox.
func (p *Pool) discard(s Sandbox) {
	if s.restore != nil {
		s.restore.Cancel()
	}
	if s.resume != nil {
		s.resume.Cancel()
	}
	p.r.Destroy(s.ID)
}

// create creates one sandbox: created, or restored paused from p.image;
// with prespawn, with its pending restore, or its pending resume waiting for
// its line.
func (p *Pool) create() (Sandbox, error) {
	p.mu.Lock()
	// Fixed width: runsc resolves a container ID by unique prefix and
	// refuses one that prefixes another ("warm-1" once "warm-10" exists).
	s := Sandbox{ID: fmt.Sprintf("%s-%06d", p.prefix, p.next)}
	p.next++
	p.mu.Unlock()
	s.Out = filepath.Join(p.dir, s.ID+".out")
	var err error
	if p.image != "" {
		err = p.r.Restore(p.bundle, s.ID, p.image, s.Out, append([]string{"--paused"}, p.restoreArgs...)...)
	} else {
		err = p.r.Create(p.bundle, s.ID, s.Out)
	}
	switch {
	case err == nil && p.prespawn && p.image != "":
		s.resume, err = p.r.StartResume(s.ID, s.Out)
	case err == nil && p.prespawn:
		s.restore, err = p.r.StartRestore(p.bundle, s.ID, s.Out, p.restoreArgs...)
	}
	if err != nil {
		p.r.Destroy(s.ID)
		return Sandbox{}, fmt.Errorf("warmpool: creating %s: %w", s.ID, err)
	}
	return s, nil
}

func (p *Pool) kick() {
	select {
	case p.refill <- struct{}{}:
	default:
	}
}

// refiller creates sandboxes, one at a time, whenever fewer than size wait;
// after a failed create it retries every retryInterval.
func (p *Pool) refiller() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.refill:
		}
		for {
			created, wait, err := p.refillOne()
			if wait > 0 {
				select {
				case <-p.stop:
					return
				case <-time.After(wait):
				}
				continue
			}
			if err == nil && !created {
				break
			}
			if err != nil {
				select {
				case <-p.stop:
					return
				case <-time.After(retryInterval):
				}
			}
		}
	}
}

// RefillDelay is how long after serving a request a pool starts to refill.
// A refill is a `runsc create` (or a paused restore) that takes the CPUs for
// tens of milliseconds; started at once, it competes with the clone just
// served while that clone's tasks start. This covers a tick workload's first
// output (on 2 CPUs, a pre-started restore of a 256 MiB tick workload took
// 55 ms p50 to its first tick with an immediate refill and 41 ms with this
// delay, REPRODUCE.md section 10), not a workload whose first output takes
// longer, such as the CPython agent's first pass over its state. A request
// that finds the pool empty in the meantime creates its sandbox itself.
const RefillDelay = 100 * time.Millisecond

// retryInterval is how long the refiller waits after a failed create.
const retryInterval = time.Second

// maxRefillDeferral bounds how long the refiller defers a needed create for
// requests in progress or just served: under requests that keep coming less
// than RefillDelay apart, the pool still refills (and may then compete with
// one of them) rather than leave every request to create its own sandbox.
const maxRefillDeferral = time.Second

// refillWaitLocked returns how long the refiller must wait before it starts
// a create that is needed now, or 0 to start it. It waits while a request is
// in progress and until RefillDelay after the latest one returned, so that a
// wake-up older than the request (a Fill just before it) does not start a
// create next to its restore; but never more than maxRefillDeferral in all.
// A create already running when a request arrives is not stopped.
//
// +checklocks:p.mu
func (p *Pool) refillWaitLocked(now time.Time) time.Duration {
	until := p.servedAt.Add(RefillDelay)
	if p.serving == 0 && !now.Before(until) {
		p.deferredSince = time.Time{}
		return 0
	}
	if p.deferredSince.IsZero() {
		p.deferredSince = now
	}
	if now.Sub(p.deferredSince) >= maxRefillDeferral {
		p.deferredSince = time.Time{}
		return 0
	}
	wait := RefillDelay // while serving: look again then
	if p.serving == 0 {
		wait = until.Sub(now)
	}
	return min(wait, p.deferredSince.Add(maxRefillDeferral).Sub(now))
}

// refillOne creates one sandbox if fewer than size wait and
// refillWaitLocked allows it, and reports whether it did, how long to wait
// before trying again if it may not create yet, or the create's error.
func (p *Pool) refillOne() (bool, time.Duration, error) {
	p.mu.Lock()
	if p.closed || len(p.waiting) >= p.size {
		p.mu.Unlock()
		return false, 0, nil
	}
	if wait := p.refillWaitLocked(time.Now()); wait > 0 {
		p.mu.Unlock()
		return false, wait, nil
	}
	p.mu.Unlock()
	s, err := p.create()
	p.mu.Lock()
	defer p.cond.Broadcast()
	p.attempts++
	p.lastErr = err
	if err != nil {
		p.mu.Unlock()
		return false, 0, err
	}
	if p.closed {
		p.mu.Unlock()
		// Not under p.mu: discard waits for processes.
		p.discard(s)
		return false, 0, nil
	}
	p.waiting = append(p.waiting, s)
	p.mu.Unlock()
	return true, 0, nil
}

// Close stops refilling and destroys every waiting sandbox. Sandboxes handed
// out are the caller's.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	p.mu.Lock()
	waiting := p.waiting
	p.waiting = nil
	p.mu.Unlock()
	for _, s := range waiting {
		p.discard(s)
	}
}
