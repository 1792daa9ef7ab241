// Command memfdfaults measures what the host charges for a first store into
// each page of a shared memfd mapping whose pages are already allocated (as a
// restored sandbox's MemoryFile pages are after its restore), with and
// without MAP_POPULATE: a sandbox stub maps MemoryFile ranges this way on
// systrap.
//
// With -huge, the memfd's pages are allocated through a mapping advised
// MADV_HUGEPAGE and each measured mapping is advised the same way, as the
// sentry's MemoryFile does when the host's shmem_enabled is "advise" (what
// `runsc --host-settings=adjust` sets); the program prints how much of the
// memfd the host backed with huge pages.
//
// With -touch, each round also maps the memfd with MAP_POPULATE, reaches
// every page of the mapping in each of the given ways first (the kernel
// reading it, MADV_POPULATE_WRITE over it, the storing thread loading from
// it, two other threads loading from it), and then times the stores: which
// accesses pay a page's first-touch cost for the others.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkvisor/forkvisor/internal/memstat"
)

func main() {
	mib := flag.Int("mib", 256, "size of the memfd in MiB")
	rounds := flag.Int("rounds", 3, "rounds of the measurements (without and with MAP_POPULATE, then each -touch way)")
	huge := flag.Bool("huge", false, "allocate and map with MADV_HUGEPAGE")
	touch := flag.String("touch", "", "comma-separated ways to reach every page of a populated mapping before its timed stores: kernel-read, populate-write, read, read-2")
	flag.Parse()
	// "This thread" below is the thread that stores.
	runtime.LockOSThread()
	if *huge {
		mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
		if err != nil {
			log.Fatalf("reading the host's shmem THP mode: %v", err)
		}
		fmt.Printf("shmem_enabled: %s", mode)
	}
	size := *mib << 20
	fd, err := unix.MemfdCreate("memfdfaults", unix.MFD_CLOEXEC)
	if err != nil {
		log.Fatalf("memfd_create: %v", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		log.Fatalf("ftruncate: %v", err)
	}
	// Allocate every page, as a restore's copy does: with pwrite(2), no
	// mapping involved, or with -huge through an advised mapping.
	buf := make([]byte, 2<<20)
	for i := range buf {
		buf[i] = 1
	}
	hugeBefore := shmemHugeKiB()
	if *huge {
		// Through a mapping: where shmem_enabled is "advise", write(2)
		// into shmem never allocates huge pages, a fault in an advised
		// mapping may.
		b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			log.Fatalf("mmap: %v", err)
		}
		if err := unix.Madvise(b, unix.MADV_HUGEPAGE); err != nil {
			log.Fatalf("madvise(MADV_HUGEPAGE): %v", err)
		}
		for off := 0; off < size; off += len(buf) {
			copy(b[off:], buf)
		}
		if err := unix.Munmap(b); err != nil {
			log.Fatalf("munmap: %v", err)
		}
	} else {
		for off := 0; off < size; off += len(buf) {
			if _, err := unix.Pwrite(fd, buf, int64(off)); err != nil {
				log.Fatalf("write: %v", err)
			}
		}
	}
	// The host's ShmemHugePages counts every process's shmem: nothing else
	// should run meanwhile.
	fmt.Printf("allocated %d MiB, %d MiB of it in huge pages\n", *mib, (shmemHugeKiB()-hugeBefore)>>10)
	pages := size / unix.Getpagesize()
	var touches []string
	if *touch != "" {
		touches = strings.Split(*touch, ",")
		for _, t := range touches {
			if _, ok := touchers[t]; !ok {
				log.Fatalf("-touch: unknown way %q (want kernel-read, populate-write, read or read-2)", t)
			}
		}
	}
	for r := 0; r < *rounds; r++ {
		for _, populate := range []bool{false, true} {
			t0 := time.Now()
			b := mapMemfd(fd, size, populate, *huge)
			mapped := time.Since(t0)
			first, second, faults := storeTwice(b)
			fmt.Printf("populate=%-5t mmap %7.1f ms  first store into each of %d pages %7.1f ms (%.2f us per page, %d faults), second %6.1f ms\n",
				populate, ms(mapped), pages, ms(first), float64(first.Nanoseconds())/1e3/float64(pages), faults, ms(second))
		}
		for _, t := range touches {
			b := mapMemfd(fd, size, true, *huge)
			t0 := time.Now()
			touchers[t](b)
			touched := time.Since(t0)
			first, second, faults := storeTwice(b)
			fmt.Printf("populate=true  touch=%-11s %7.1f ms, then first store into each of %d pages %7.1f ms (%.2f us per page, %d faults), second %6.1f ms\n",
				t, ms(touched), pages, ms(first), float64(first.Nanoseconds())/1e3/float64(pages), faults, ms(second))
		}
	}
}

// touchers are the ways -touch can reach every page of a populated mapping
// before the timed stores.
var touchers = map[string]func(b []byte){
	// The kernel reads every page through this process's page tables:
	// pwrite(2) of the mapping into a file in /dev/shm.
	"kernel-read": func(b []byte) {
		sink, err := os.CreateTemp("/dev/shm", "memfdfaults-sink")
		if err != nil {
			log.Fatalf("creating the sink: %v", err)
		}
		defer os.Remove(sink.Name())
		defer sink.Close()
		for off := 0; off < len(b); off += 1 << 20 {
			if _, err := unix.Pwrite(int(sink.Fd()), b[off:min(off+1<<20, len(b))], 0); err != nil {
				log.Fatalf("pwrite into the sink: %v", err)
			}
		}
	},
	// The kernel faults every page in for writing: madvise(2)
	// MADV_POPULATE_WRITE over the mapping.
	"populate-write": func(b []byte) {
		if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err != nil {
			log.Fatalf("madvise(MADV_POPULATE_WRITE): %v", err)
		}
	},
	// The storing thread loads one byte of every page.
	"read": func(b []byte) { readSum += readPages(b) },
	// Two other threads load one byte of every page, each of one half.
	// Each goroutine locks its thread and exits locked, so its thread is
	// neither the storing one nor reused.
	"read-2": func(b []byte) {
		var wg sync.WaitGroup
		var sums [2]int
		for i, half := range [][]byte{b[:len(b)/2], b[len(b)/2:]} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				sums[i] = readPages(half)
			}()
		}
		wg.Wait()
		readSum += sums[0] + sums[1]
	},
}

// readSum keeps readPages's loads from being optimized away.
var readSum int

// readPages loads one byte of every page of b and returns their sum.
func readPages(b []byte) int {
	s := 0
	for off := 0; off < len(b); off += unix.Getpagesize() {
		s += int(b[off])
	}
	return s
}

// mapMemfd maps size bytes of fd shared and writable, with MAP_POPULATE if
// populate, and advised MADV_HUGEPAGE after that if huge.
func mapMemfd(fd, size int, populate, huge bool) []byte {
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		log.Fatalf("mmap: %v", err)
	}
	if huge {
		if err := unix.Madvise(b, unix.MADV_HUGEPAGE); err != nil {
			log.Fatalf("madvise(MADV_HUGEPAGE): %v", err)
		}
	}
	return b
}

// storeTwice stores into every page of b twice, unmaps b, and returns how
// long each pass took and the minor faults of the first.
func storeTwice(b []byte) (first, second time.Duration, faults int64) {
	var ru0, ru1 unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru0); err != nil {
		log.Fatalf("getrusage: %v", err)
	}
	t1 := time.Now()
	for off := 0; off < len(b); off += unix.Getpagesize() {
		b[off] = 2
	}
	t2 := time.Now()
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru1); err != nil {
		log.Fatalf("getrusage: %v", err)
	}
	for off := 0; off < len(b); off += unix.Getpagesize() {
		b[off] = 3
	}
	t3 := time.Now()
	if err := unix.Munmap(b); err != nil {
		log.Fatalf("munmap: %v", err)
	}
	return t2.Sub(t1), t3.Sub(t2), ru1.Minflt - ru0.Minflt
}

// shmemHugeKiB returns the host's ShmemHugePages (KiB), or 0 if
// /proc/meminfo does not say.
func shmemHugeKiB() int64 {
	n, err := memstat.FieldKiB("/proc/meminfo", "ShmemHugePages")
	if err != nil {
		return 0
	}
	return int64(n)
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
