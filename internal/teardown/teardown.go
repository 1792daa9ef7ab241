// Package teardown runs the clean-ups that a command registers (sandbox
// roots, mounts, loop devices, temporary directories) once, latest first:
// when the command ends, fails, or is interrupted.
package teardown

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
)

var (
	mu       sync.Mutex
	cleanups []func()
	// running counts the Runs in progress; a Fatalf waits for them before
	// it exits.
	running sync.WaitGroup
)

// Add registers f to run at Run.
func Add(f func()) {
	mu.Lock()
	defer mu.Unlock()
	cleanups = append(cleanups, f)
}

// Run runs the registered clean-ups, latest first, and forgets them. The
// list is taken first, so that Runs in several goroutines run each
// clean-up once. Clean-ups must not call Fatalf (it would wait for itself).
func Run() {
	mu.Lock()
	cs := cleanups
	cleanups = nil
	running.Add(1)
	mu.Unlock()
	defer running.Done()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

var (
	// exiting is set by the first Fatalf, which closes cleanedUp once every
	// clean-up has run.
	exiting   atomic.Bool
	cleanedUp = make(chan struct{})
)

// Fatalf prints "name: " and the message to stderr, runs the clean-ups that
// no Run has taken yet, waits for a Run in progress (the command's own end)
// to finish, and exits with status 1. A Fatalf in another goroutine meanwhile
// (a failure that the first one's clean-ups caused) waits for the first to
// finish them.
func Fatalf(name, format string, args ...any) {
	fmt.Fprintf(os.Stderr, name+": "+format+"\n", args...)
	if exiting.CompareAndSwap(false, true) {
		Run()
		running.Wait()
		close(cleanedUp)
	}
	<-cleanedUp
	os.Exit(1)
}

// OnInterrupt makes Ctrl-C and SIGTERM end the command as a failure does
// (Fatalf with name); a second one exits at once, clean-ups or not.
func OnInterrupt(name string) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		signal.Reset(os.Interrupt, syscall.SIGTERM)
		Fatalf(name, "interrupted (%v)", sig)
	}()
}
