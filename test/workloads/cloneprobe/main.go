// Command cloneprobe prints what a clone of a parked sandbox can use as its
// identity or its randomness, so that clones of one checkpoint can be
// compared: which values are fresh in every clone, which are identical, and
// which the workload can reseed when the runtime tells it that it was
// restored (the clone contract, DESIGN.md §7).
//
// Usage: cloneprobe [-interval D] [-reseed-signal SIG]
//
// At start it seeds a userspace PRNG from getrandom and maps one anonymous
// page (its address depends on ASLR). With -reseed-signal, it reseeds the
// PRNG from getrandom whenever that signal arrives and counts the signals.
// Every interval it prints one line:
//
//	probe n=N gen=G signals=S boot_id=B uuid=U getrandom=HEX urandom=HEX prng=HEX mono_ns=M wall_ns=W addr=0xA pid=P
//
// n counts lines from 0 and continues across checkpoint and restore. gen is
// /proc/sys/kernel/restore_generation ("none" where the file does not exist,
// e.g. upstream runsc); boot_id and uuid are read from
// /proc/sys/kernel/random at each line; getrandom and urandom are 8 fresh
// bytes from getrandom(2) and from /dev/urandom; prng is the PRNG's next
// value (clones that did not reseed print the same sequence); mono_ns and
// wall_ns are CLOCK_MONOTONIC and CLOCK_REALTIME.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	interval := flag.Duration("interval", 50*time.Millisecond, "line interval")
	reseedSignal := flag.String("reseed-signal", "", "reseed the PRNG on this signal (e.g. USR2)")
	flag.Parse()

	var (
		mu      sync.Mutex
		prng    = rand.New(rand.NewPCG(seed()))
		signals int
	)
	if *reseedSignal != "" {
		sig := unix.SignalNum("SIG" + strings.TrimPrefix(strings.ToUpper(*reseedSignal), "SIG"))
		if sig == 0 {
			fmt.Fprintf(os.Stderr, "cloneprobe: unknown signal %q\n", *reseedSignal)
			os.Exit(2)
		}
		ch := make(chan os.Signal, 16)
		signal.Notify(ch, sig)
		go func() {
			for range ch {
				mu.Lock()
				prng = rand.New(rand.NewPCG(seed()))
				signals++
				mu.Unlock()
			}
		}()
	}
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cloneprobe: mmap: %v\n", err)
		os.Exit(1)
	}
	addr := fmt.Sprintf("%p", &page[0])

	for n := 0; ; n++ {
		mu.Lock()
		v, s := prng.Uint64(), signals
		mu.Unlock()
		fmt.Printf("probe n=%d gen=%s signals=%d boot_id=%s uuid=%s getrandom=%s urandom=%s prng=%016x mono_ns=%d wall_ns=%d addr=%s pid=%d\n",
			n, procValue("/proc/sys/kernel/restore_generation"), s,
			procValue("/proc/sys/kernel/random/boot_id"), procValue("/proc/sys/kernel/random/uuid"),
			getrandomHex(), urandomHex(), v, clock(unix.CLOCK_MONOTONIC), clock(unix.CLOCK_REALTIME),
			addr, os.Getpid())
		time.Sleep(*interval)
	}
}

// seed returns two words from getrandom.
func seed() (uint64, uint64) {
	var b [16]byte
	if _, err := unix.Getrandom(b[:], 0); err != nil {
		panic(err)
	}
	return binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
}

func procValue(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "none"
	}
	return strings.TrimSpace(string(b))
}

func getrandomHex() string {
	var b [8]byte
	if _, err := unix.Getrandom(b[:], 0); err != nil {
		return "error"
	}
	return fmt.Sprintf("%x", b)
}

func urandomHex() string {
	f, err := os.Open("/dev/urandom")
	if err != nil {
		return "error"
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.Read(b[:]); err != nil {
		return "error"
	}
	return fmt.Sprintf("%x", b)
}

func clock(id int32) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		return -1
	}
	return ts.Nano()
}
