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
	"time"
)

var (
	mu       sync.Mutex
	cleanups []func()
)

// Add registers f to run at Run.
func Add(f func()) {
	mu.Lock()
	defer mu.Unlock()
	cleanups = append(cleanups, f)
}

// Run runs the registered clean-ups, latest first, and forgets them. The
// list is taken first, so that a clean-up that fails and calls Fatalf in
// turn exits instead of waiting for the lock.
func Run() {
	mu.Lock()
	cs := cleanups
	cleanups = nil
	mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// exiting is set by the first Fatalf.
var exiting atomic.Bool

// Fatalf prints "name: " and the message to stderr, runs the clean-ups, and
// exits with status 1. A Fatalf while another one runs the clean-ups (a
// failure that the interrupt of the first one caused, in another goroutine)
// leaves them to it and waits for it to exit, for a minute at most (a
// clean-up that fails in turn does not wait on itself for longer).
func Fatalf(name, format string, args ...any) {
	fmt.Fprintf(os.Stderr, name+": "+format+"\n", args...)
	if !exiting.CompareAndSwap(false, true) {
		time.Sleep(time.Minute)
		os.Exit(1)
	}
	Run()
	os.Exit(1)
}

// OnInterrupt makes Ctrl-C and SIGTERM end the command as a failure does
// (Fatalf with name).
func OnInterrupt(name string) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() { Fatalf(name, "interrupted (%v)", <-sigs) }()
}
