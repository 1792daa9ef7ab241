// Command pywrites measures, page by page, what one pass of the CPython
// agent (test/workloads/pyagent) writes of its heap: the least that any
// copy-on-write scheme, however fine, must copy per clone of that workload.
//
// It runs the agent's State natively (chroot into the Python root
// filesystem that tools/pyrootfs.sh builds, the same interpreter the
// sandboxes run), forks a child that only waits, so that every anonymous
// page is shared between the two, then has the parent run one checksum
// pass (what every tick does). A page that the pass wrote has been copied
// by the host's copy-on-write: the parent maps a new page frame there
// (/proc/PID/pagemap's frame number, which root can read); one that it only
// read is still the frame it shares with the child. It prints how many
// pages were written, in how many runs of consecutive pages, how many of
// them still hold the bytes they held before (the child's copy, read
// through /proc/PID/mem: writes that a comparison of contents would miss;
// the child's own few writes while it waits make this a slight
// undercount),
// and how they fall into 2 MiB windows: the unit of the fork's window
// copies.
//
// Usage (root): go run ./bench/pywrites [-entries N] [-seed S]
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// driver runs in the chroot: it builds the agent's state, forks a child that
// says it is idle and then waits until the parent exits (EOF on a pipe), and
// runs one pass when told to.
const driver = `
import os, sys
ns = {"__name__": "pyagent"}
exec(os.environ["PYAGENT_SOURCE"], ns)
st = ns["State"](int(sys.argv[1]), int(sys.argv[2]))
r, w = os.pipe()
idle_r, idle_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w)
    os.close(idle_r)
    os.write(idle_w, b"i")
    os.read(r, 1)
    os._exit(0)
os.close(r)
os.close(idle_w)
os.read(idle_r, 1)
print("ready", pid, flush=True)
sys.stdin.readline()
ok = st.checksum() == st.expected
print("done", "ok" if ok else "BAD", flush=True)
sys.stdin.readline()
`

const pageSize = 4096

// anonPage is a present private anonymous page of a process.
type anonPage struct {
	vpn, pfn uint64 // virtual page number, page frame number
	shared   bool   // another process maps the frame too
}

// anonPages returns the present private anonymous pages of pid's writable
// mappings, in address order.
func anonPages(pid int) ([]anonPage, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	var pages []anonPage
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[1], "rw") || f[1][3] != 'p' {
			continue
		}
		r := strings.SplitN(f[0], "-", 2)
		start, err1 := strconv.ParseUint(r[0], 16, 64)
		end, err2 := strconv.ParseUint(r[1], 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("/proc/%d/maps: bad line %q", pid, line)
		}
		buf := make([]byte, (end-start)/pageSize*8)
		if _, err := pm.ReadAt(buf, int64(start/pageSize*8)); err != nil && err != io.EOF {
			return nil, fmt.Errorf("/proc/%d/pagemap: %w", pid, err)
		}
		for i := 0; i+8 <= len(buf); i += 8 {
			e := binary.LittleEndian.Uint64(buf[i:])
			const present, fileOrShared, excl, pfnMask = 1 << 63, 1 << 61, 1 << 56, 1<<55 - 1
			if e&present == 0 || e&fileOrShared != 0 {
				continue
			}
			pages = append(pages, anonPage{vpn: start/pageSize + uint64(i/8), pfn: e & pfnMask, shared: e&excl == 0})
		}
	}
	return pages, nil
}

func main() {
	entries := flag.Int("entries", 200000, "entries of the agent's state (its default)")
	seed := flag.Int("seed", 1, "seed of the state's content")
	flag.Parse()
	wd, err := os.Getwd()
	must(err)
	rootfs, err := sandbox.PyRootfs(wd)
	must(err)
	src, err := os.ReadFile(filepath.Join(wd, sandbox.PyAgentScript))
	must(err)

	cmd := exec.Command("chroot", rootfs, "/usr/bin/python3", "-c", driver, strconv.Itoa(*entries), strconv.Itoa(*seed))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PYAGENT_SOURCE=" + string(src)}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(err)
	stdout, err := cmd.StdoutPipe()
	must(err)
	must(cmd.Start())
	defer cmd.Wait()
	defer stdin.Close()
	out := bufio.NewScanner(stdout)
	expect := func(prefix string) string {
		if !out.Scan() || !strings.HasPrefix(out.Text(), prefix) {
			fatalf("the agent's driver printed %q, want %q (%v)", out.Text(), prefix, out.Err())
		}
		return out.Text()
	}
	ready := strings.Fields(expect("ready"))
	pid := cmd.Process.Pid
	if len(ready) != 2 {
		fatalf("the agent's driver printed %q, want \"ready CHILD_PID\"", strings.Join(ready, " "))
	}
	childPID, err := strconv.Atoi(ready[1])
	must(err)
	before, err := anonPages(pid)
	must(err)
	nShared := 0
	for _, pg := range before {
		if pg.shared {
			if pg.pfn == 0 {
				fatalf("/proc/%d/pagemap shows no page frame numbers (run as root)", pid)
			}
			nShared++
		}
	}
	_, err = io.WriteString(stdin, "go\n")
	must(err)
	if done := expect("done"); done != "done ok" {
		fatalf("the pass's checksum is wrong: %q", done)
	}
	after, err := anonPages(pid)
	must(err)
	wrote := written(before, after)
	unchanged := sameContent(pid, childPID, wrote)
	_, err = io.WriteString(stdin, "exit\n")
	must(err)

	// 2 MiB windows over the pages that were shared before the pass, and
	// runs of written pages (windows of one page).
	const pagesPerWindow = 512
	windows := map[uint64][2]int{} // window -> {shared pages, written pages}
	for _, pg := range before {
		if !pg.shared {
			continue
		}
		w := windows[pg.vpn/pagesPerWindow]
		w[0]++
		if wrote[pg.vpn] {
			w[1]++
		}
		windows[pg.vpn/pagesPerWindow] = w
	}
	_, runs := windowCopy(before, wrote, 1)
	var touched, mostly, whole int
	for _, w := range windows {
		switch {
		case w[1] == w[0]:
			whole++
			touched++
		case w[1]*4 >= w[0]*3:
			mostly++
			touched++
		case w[1] > 0:
			touched++
		}
	}
	mib := func(pages int) float64 { return float64(pages) * pageSize / (1 << 20) }
	fmt.Printf("pyagent entries=%d seed=%d: %d private anonymous pages (%.1f MiB) shared with an idle fork child before the pass\n",
		*entries, *seed, nShared, mib(nShared))
	fmt.Printf("one pass wrote %d of them (%.1f%%, %.1f MiB) in %d runs of consecutive pages; %.1f MiB were only read\n",
		len(wrote), 100*float64(len(wrote))/float64(max(nShared, 1)), mib(len(wrote)), runs, mib(nShared-len(wrote)))
	fmt.Printf("of the written pages, %d (%.1f%%) hold the same bytes as before the pass: a comparison of contents would not see those writes\n",
		unchanged, 100*float64(unchanged)/float64(max(len(wrote), 1)))
	fmt.Printf("2 MiB windows holding such pages: %d; with a written page: %d; at least 3/4 written: %d; wholly written: %d\n",
		len(windows), touched, mostly+whole, whole)

	// What a copy-on-write scheme that copies aligned windows of each size
	// would copy, and how many runs of copied windows (each a mapping of its
	// own between shared ones) it would leave.
	fmt.Printf("%-8s %12s %14s %8s\n", "window", "copied_MiB", "of_written", "runs")
	for _, size := range []uint64{1, 4, 16, 64, 256, pagesPerWindow} {
		copied, runs := windowCopy(before, wrote, size)
		fmt.Printf("%-8s %12.1f %13.2fx %8d\n", fmt.Sprintf("%dK", size*pageSize/1024), mib(copied), float64(copied)/float64(max(len(wrote), 1)), runs)
	}
}

// written returns the pages that were shared before a pass (before) and that
// the parent maps to another frame after it (after): a write by the child
// would leave the parent's frame in place, so the pass wrote them.
func written(before, after []anonPage) map[uint64]bool {
	sharedFrame := map[uint64]uint64{}
	for _, pg := range before {
		if pg.shared {
			sharedFrame[pg.vpn] = pg.pfn
		}
	}
	w := map[uint64]bool{}
	for _, pg := range after {
		if pfn, ok := sharedFrame[pg.vpn]; ok && pg.pfn != pfn {
			w[pg.vpn] = true
		}
	}
	return w
}

// sameContent returns how many of the pages in vpns hold the same bytes in
// processes a and b (read through /proc/PID/mem); a page that either cannot
// be read there counts as different.
func sameContent(a, b int, vpns map[uint64]bool) int {
	fa, errA := os.Open(fmt.Sprintf("/proc/%d/mem", a))
	fb, errB := os.Open(fmt.Sprintf("/proc/%d/mem", b))
	if errA != nil || errB != nil {
		fatalf("cannot read the processes' memory: %v, %v", errA, errB)
	}
	defer fa.Close()
	defer fb.Close()
	pa, pb := make([]byte, pageSize), make([]byte, pageSize)
	same := 0
	for vpn := range vpns {
		_, errA := fa.ReadAt(pa, int64(vpn*pageSize))
		_, errB := fb.ReadAt(pb, int64(vpn*pageSize))
		if errA == nil && errB == nil && bytes.Equal(pa, pb) {
			same++
		}
	}
	return same
}

// windowCopy returns the number of shared pages that lie in aligned windows
// of size pages holding a written page, and the number of runs of such
// windows: a run ends at a shared page of a window without writes, or where
// the next copied window is not adjacent. (Pages that were not shared, which
// no scheme copies, neither end nor count in a run.)
func windowCopy(pages []anonPage, written map[uint64]bool, size uint64) (copied, runs int) {
	dirty := map[uint64]bool{}
	for v := range written {
		dirty[v/size] = true
	}
	prev, inRun := uint64(0), false
	for _, pg := range pages {
		if !pg.shared {
			continue
		}
		if !dirty[pg.vpn/size] {
			inRun = false
			continue
		}
		copied++
		if w := pg.vpn / size; !inRun || (w != prev && w != prev+1) {
			runs++
		}
		prev, inRun = pg.vpn/size, true
	}
	return copied, runs
}

func must(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pywrites: "+format+"\n", args...)
	os.Exit(1)
}
