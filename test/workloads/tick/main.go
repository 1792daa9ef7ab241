// Command tick is the built-in workload: it fills a heap of a given size with
// a deterministic pattern, then every interval prints a tick counter and
// whether the heap still holds the pattern. A restored clone must continue
// the counter (not restart it) and keep printing "sum=ok".
//
// Usage: tick [-mib N] [-interval D] [-check-mib N] [-write-pct P] [-creep] [-seed S] [-ksm] [-ctl PATH]
//
// With -write-pct P, every tick first stores into P% of the heap's pages,
// chosen by a fixed hash and visited in a scattered order, before it prints:
// a writer like a runtime that updates reference counts or GC marks over its
// heap. The stored values equal the pattern, so the check still holds; after
// a restore, the first line comes only after every store of the first tick.
//
// With -creep, every tick also stores into one more 2 MiB window of the heap
// (its first page, the same value), window after window, wrapping around: a
// clone's written set then grows by a window per tick for as many ticks as
// the heap has windows, so a learner of its write set keeps seeing new
// writes that long.
//
// Output, one line per tick:
//
//	tick=N mib=M sum=ok|BAD mark=HEX
//
// Commands: every tick, if the file PATH (default /tmp/ctl) exists, its
// content is run as a command and the file is removed. `tick -send CMD`
// writes CMD there (for `runsc exec`).
//
//	mark      write a fresh random value (getrandom) into the heap; every
//	          later line prints the value read back from the heap as mark=
//	fork      fork(); the child checks the heap pattern and the mark and
//	          prints "forkchild sum=ok|BAD mark=HEX", then exits
//	scribble  write every second page of the heap (same values), the
//	          worst case for copy-on-write sharing
//	window1   write the first page of every 2 MiB of the heap (same values),
//	          the sparsest writer that still touches every window
//	exec      make a page that was written at start (a single return
//	          instruction) executable, call it, and print "exec ok"
//	dump      also write the next status line to /tmp/dump (read it back
//	          with `tick -cat /tmp/dump`)
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seedMix is mixed into every word of the pattern (-seed): 0, the default,
// gives every process the same heap.
var seedMix uint64

// mix is a fixed hash of i.
func mix(i int) uint64 {
	x := uint64(i)*0x9E3779B97F4A7C15 + 1
	x ^= x >> 29
	return x
}

// pattern returns the expected value of word i of the heap.
func pattern(i int) uint64 {
	return mix(i) ^ seedMix
}

// saveRestoreModeEnv names the variable in which runsc tells the binary of
// `runsc checkpoint --save-restore-exec-argv` why it runs: "save", "restore"
// or "resume".
const saveRestoreModeEnv = "GVISOR_SAVE_RESTORE_AUTO_EXEC_MODE"

const (
	wordsPerPage = 4096 / 8
	windowWords  = (2 << 20) / 8
)

func main() {
	mib := flag.Int("mib", 64, "heap size in MiB")
	interval := flag.Duration("interval", 100*time.Millisecond, "tick interval")
	ctl := flag.String("ctl", "/tmp/ctl", "command file")
	send := flag.String("send", "", "write this command to the command file and exit")
	cat := flag.String("cat", "", "print this file and exit (the image has no cat)")
	exit := flag.Int("exit", -1, "if >= 0, print one line and exit with this status at once")
	exitInMode := flag.String("exit-in-mode", "", "with -exit: exit with that status only when run as gVisor's save/restore binary in this mode (save, restore or resume, from "+saveRestoreModeEnv+"), and with 0 otherwise")
	checkMiB := flag.Int("check-mib", 4, "MiB of the heap checked per tick")
	filePath := flag.String("file", "", "if set, a file in the writable layer: written with a pattern at start (unless it exists), then checked like the heap")
	fileMiB := flag.Int("file-mib", 16, "size of -file in MiB")
	writePct := flag.Int("write-pct", 0, "percent of heap pages stored into every tick, in a scattered order, before printing")
	creep := flag.Bool("creep", false, "every tick, also store into the first page of the next 2 MiB window of the heap, wrapping around")
	seed := flag.Uint64("seed", 0, "if not 0, a heap whose content no process with another seed shares (every page differs)")
	ksm := flag.Bool("ksm", false, "mark the heap mergeable for KSM (madvise MADV_MERGEABLE) once it is filled")
	flag.Parse()
	seedMix = *seed * 0xD6E8FEB86659FD93
	if *writePct < 0 || *writePct > 100 {
		fmt.Fprintf(os.Stderr, "-write-pct %d: want 0..100\n", *writePct)
		os.Exit(2)
	}

	if *exit >= 0 {
		status := *exit
		if *exitInMode != "" && os.Getenv(saveRestoreModeEnv) != *exitInMode {
			status = 0
		}
		fmt.Printf("exiting %d\n", status)
		os.Exit(status)
	}
	if *cat != "" {
		b, err := os.ReadFile(*cat)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		return
	}
	if *send != "" {
		tmp := *ctl + ".tmp"
		if err := os.WriteFile(tmp, []byte(*send), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := os.Rename(tmp, *ctl); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}

	words := *mib << 20 / 8
	heap := make([]uint64, words)
	for i := range heap {
		heap[i] = pattern(i)
	}
	if *ksm {
		if err := markMergeable(heap); err != nil {
			fmt.Printf("ksm: %v\n", err)
			os.Exit(1)
		}
	}
	// The mark lives in its own page in the middle of the heap; that page is
	// excluded from the pattern check once marked.
	markIdx := (words / 2) &^ (wordsPerPage - 1)
	marked := false
	check := func(i int) bool {
		if marked && i >= markIdx && i < markIdx+wordsPerPage {
			return true
		}
		return heap[i] == pattern(i)
	}

	writes := writeOrder(len(heap)/wordsPerPage, *writePct, markIdx/wordsPerPage)
	// creepWindow is the window that -creep stores into next.
	creepWindow := 0
	code, err := newCodePage()
	if err != nil {
		fmt.Printf("code page: %v\n", err)
		os.Exit(1)
	}

	var lf *layerFile
	if *filePath != "" {
		var err error
		if lf, err = openLayerFile(*filePath, *fileMiB); err != nil {
			fmt.Printf("file failed: %v\n", err)
			os.Exit(1)
		}
	}

	// Verify a slice of the heap per tick so that every page is checked
	// within a few seconds without slowing the tick.
	wordsPerTick := *checkMiB << 20 / 8
	next := 0
	bad := false
	dump := false
	for tick := 0; ; tick++ {
		// Take the command file by renaming it, so that a command sent
		// while this one is read is not removed with it.
		if cmd, err := takeFile(*ctl); err == nil {
			switch strings.TrimSpace(string(cmd)) {
			case "mark":
				var b [8]byte
				if _, err := unix.Getrandom(b[:], 0); err != nil {
					fmt.Printf("mark failed: %v\n", err)
					break
				}
				v := uint64(0)
				for _, c := range b {
					v = v<<8 | uint64(c)
				}
				marked = true
				for j := 0; j < wordsPerPage; j++ {
					heap[markIdx+j] = v
				}
			case "fork":
				forkAndCheck(heap, check, markIdx)
			case "filemark":
				if lf == nil {
					fmt.Printf("filemark: no -file\n")
					break
				}
				if err := lf.mark(); err != nil {
					fmt.Printf("filemark failed: %v\n", err)
				}
			case "dump":
				// The next status line also goes to /tmp/dump, for callers
				// that cannot see the workload's output.
				dump = true
			case "scribble":
				for i := 0; i < words; i += 2 * wordsPerPage {
					atomic.AddUint64(&heap[i], 0)
				}
				fmt.Printf("scribbled\n")
			case "exec":
				if err := callCodePage(code); err != nil {
					fmt.Printf("exec failed: %v\n", err)
					break
				}
				fmt.Printf("exec ok\n")
			case "window1":
				for i := 0; i < words; i += (2 << 20) / 8 {
					atomic.AddUint64(&heap[i], 0)
				}
				fmt.Printf("window1 done\n")
			default:
				fmt.Printf("unknown command %q\n", cmd)
			}
		}
		for _, p := range writes {
			i := p * wordsPerPage
			heap[i] = pattern(i)
		}
		if *creep {
			i := creepWindow * windowWords
			if i == markIdx {
				i += wordsPerPage // the mark's page keeps the mark
			}
			if i < words {
				heap[i] = pattern(i)
			}
			creepWindow = (creepWindow + 1) % ((words + windowWords - 1) / windowWords)
		}
		sum := "ok"
		if bad {
			sum = "BAD"
		}
		mark := uint64(0)
		if marked {
			mark = heap[markIdx]
		}
		line := fmt.Sprintf("tick=%d mib=%d sum=%s mark=%x", tick, *mib, sum, mark)
		if lf != nil {
			line += fmt.Sprintf(" file=%s filemark=%x", lf.status(), lf.markValue())
		}
		fmt.Println(line)
		if dump {
			dump = false
			if err := os.WriteFile("/tmp/dump.tmp", []byte(line+"\n"), 0o644); err == nil {
				os.Rename("/tmp/dump.tmp", "/tmp/dump")
			}
		}
		// Check after printing, so that the time to the first line after a
		// restore does not depend on how much is checked per tick; a bad
		// word shows in the next line.
		for n := 0; n < wordsPerTick && n < words; n++ {
			if !check(next) {
				bad = true
			}
			next = (next + 1) % words
		}
		if lf != nil {
			lf.checkSome(wordsPerTick * 8)
		}
		time.Sleep(*interval)
	}
}

// writeOrder returns the pages that a writer stores into every tick: pct% of
// nPages, picked by a hash of the page index (so every clone of one image
// writes the same set, as runtimes do) and ordered by a multiplicative
// permutation of the page indices (so consecutive stores land far apart).
// skip (the mark page) is never picked.
func writeOrder(nPages, pct, skip int) []int {
	if pct == 0 || nPages == 0 {
		return nil
	}
	var order []int
	// An odd stride is coprime with a power-of-two page count; other counts
	// fall back to a stride that is checked to be coprime.
	stride := 0x9E3779B1 % nPages
	for stride == 0 || gcd(stride, nPages) != 1 {
		stride++
	}
	for k := 0; k < nPages; k++ {
		p := k * stride % nPages
		if p != skip && int(mix(p)%100) < pct {
			order = append(order, p)
		}
	}
	return order
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// forkAndCheck forks. The child, which must not call into the Go runtime,
// checks every word of the heap and prints one line with raw syscalls; the
// parent waits for it.
func forkAndCheck(heap []uint64, check func(int) bool, markIdx int) {
	// Format the child's output buffer before forking.
	var line [64]byte
	pid, _, errno := unix.RawSyscall(unix.SYS_FORK, 0, 0, 0)
	if errno != 0 {
		fmt.Printf("fork failed: %v\n", errno)
		return
	}
	if pid == 0 {
		ok := true
		for i := range heap {
			if !check(i) {
				ok = false
			}
		}
		n := copy(line[:], "forkchild sum=")
		if ok {
			n += copy(line[n:], "ok")
		} else {
			n += copy(line[n:], "BAD")
		}
		n += copy(line[n:], " mark=")
		n += putHex(line[n:], heap[markIdx])
		line[n] = '\n'
		unix.RawSyscall(unix.SYS_WRITE, 1, uintptr(unsafe.Pointer(&line[0])), uintptr(n+1))
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
}

// putHex writes v in hex without leading zeroes and returns the length.
func putHex(b []byte, v uint64) int {
	const digits = "0123456789abcdef"
	var tmp [16]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = digits[v&15]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return copy(b, tmp[i:])
}

// markMergeable marks the whole pages of heap mergeable by KSM.
func markMergeable(heap []uint64) error {
	start := uintptr(unsafe.Pointer(&heap[0]))
	end := start + uintptr(len(heap))*8
	first, last := (start+4095)&^4095, end&^4095
	if last <= first {
		return nil
	}
	b := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&heap[0]), first-start)), last-first)
	return unix.Madvise(b, unix.MADV_MERGEABLE)
}

// takeFile renames path aside, then returns its content and removes it.
func takeFile(path string) ([]byte, error) {
	taken := path + ".taken"
	if err := os.Rename(path, taken); err != nil {
		return nil, err
	}
	defer os.Remove(taken)
	return os.ReadFile(taken)
}
