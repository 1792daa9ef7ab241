// Command memfdfaults measures what the host charges for a first store into
// each page of a shared memfd mapping whose pages are already allocated (as a
// restored sandbox's MemoryFile pages are after its restore), with and
// without MAP_POPULATE: a sandbox stub maps MemoryFile ranges this way on
// systrap.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	mib := flag.Int("mib", 256, "size of the memfd in MiB")
	rounds := flag.Int("rounds", 3, "rounds of both ways")
	flag.Parse()
	size := *mib << 20
	fd, err := unix.MemfdCreate("memfdfaults", unix.MFD_CLOEXEC)
	if err != nil {
		log.Fatalf("memfd_create: %v", err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	if err := f.Truncate(int64(size)); err != nil {
		log.Fatalf("ftruncate: %v", err)
	}
	// Allocate every page, as a restore's copy does (no mapping involved).
	buf := make([]byte, 2<<20)
	for i := range buf {
		buf[i] = 1
	}
	for off := 0; off < size; off += len(buf) {
		if _, err := f.WriteAt(buf, int64(off)); err != nil {
			log.Fatalf("write: %v", err)
		}
	}
	pages := size / unix.Getpagesize()
	for r := 0; r < *rounds; r++ {
		for _, populate := range []bool{false, true} {
			flags := unix.MAP_SHARED
			if populate {
				flags |= unix.MAP_POPULATE
			}
			t0 := time.Now()
			b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
			if err != nil {
				log.Fatalf("mmap: %v", err)
			}
			var ru0, ru1 unix.Rusage
			if err := unix.Getrusage(unix.RUSAGE_SELF, &ru0); err != nil {
				log.Fatalf("getrusage: %v", err)
			}
			t1 := time.Now()
			for off := 0; off < size; off += unix.Getpagesize() {
				b[off] = 2
			}
			t2 := time.Now()
			if err := unix.Getrusage(unix.RUSAGE_SELF, &ru1); err != nil {
				log.Fatalf("getrusage: %v", err)
			}
			for off := 0; off < size; off += unix.Getpagesize() {
				b[off] = 3
			}
			t3 := time.Now()
			if err := unix.Munmap(b); err != nil {
				log.Fatalf("munmap: %v", err)
			}
			fmt.Printf("populate=%-5t mmap %7.1f ms  first store into each of %d pages %7.1f ms (%.2f us per page, %d faults), second %6.1f ms\n",
				populate, ms(t1.Sub(t0)), pages, ms(t2.Sub(t1)), float64(t2.Sub(t1).Nanoseconds())/1e3/float64(pages), ru1.Minflt-ru0.Minflt, ms(t3.Sub(t2)))
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
