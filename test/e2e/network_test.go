package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkvisor/forkvisor/internal/kvclient"
	"github.com/forkvisor/forkvisor/internal/netns"
	"github.com/forkvisor/forkvisor/internal/prereq"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// TestNetworkClones parks an HTTP key-value server running on gVisor's own
// network stack (--network=sandbox) with in-memory state, and restores 4
// clones over a shared base, each into a network namespace of its own with
// its own address: every clone serves the inherited state on its new
// address, accepts new connections, and keeps its own writes private. A
// connection that was established when the sandbox was parked ends with
// EOF in every clone, and its peer is not told.
func TestNetworkClones(t *testing.T) {
	bin := binary(t, "runsc")
	if _, err := exec.LookPath("ip"); err != nil {
		prereq.Missing(t, "needs iproute2 (ip) to create network namespaces: %v", err)
	}
	dir := t.TempDir()
	r := &sandbox.Runsc{Bin: bin, Root: filepath.Join(dir, "root"), Network: "sandbox"}
	t.Cleanup(r.Cleanup)
	tag := fmt.Sprintf("fv%d", os.Getpid()%100000)
	newNS := func(k int) *netns.NS {
		t.Helper()
		ns, err := netns.Create(fmt.Sprintf("%s-%d", tag, k), fmt.Sprintf("%sh%d", tag, k), 200+k)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ns.Delete)
		return ns
	}
	newBundle := func(name string, ns *netns.NS) string {
		t.Helper()
		b := filepath.Join(dir, name)
		if err := sandbox.NewBundle(b, kvserverBin, "-mib", "32"); err != nil {
			t.Fatal(err)
		}
		if err := sandbox.SetNetNS(b, ns.Path); err != nil {
			t.Fatal(err)
		}
		return b
	}

	srcNS := newNS(0)
	srcOut := filepath.Join(dir, "source.out")
	if err := r.Run(newBundle("source", srcNS), "source", srcOut); err != nil {
		t.Fatal(err)
	}
	waitLine(t, srcOut, 0, "ready ")
	src := kvclient.New(srcNS.GuestIP)
	if err := src.Set("origin", "source"); err != nil {
		t.Fatal(err)
	}
	if got := whoami(t, src); !strings.Contains(got, srcNS.GuestIP+"/24") {
		t.Fatalf("source's addresses %q do not include %s", got, srcNS.GuestIP)
	}
	held, err := net.DialTimeout("tcp", net.JoinHostPort(srcNS.GuestIP, "9000"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	waitLine(t, srcOut, 0, "held n=0 from=")

	image := filepath.Join(dir, "image")
	if err := r.Checkpoint("source", image, "--shared-base"); err != nil {
		t.Fatal(err)
	}
	r.Destroy("source")
	// Nobody tells the peer of the established connection: the parked
	// sandbox's stack is gone and the clones have other addresses. The peer
	// finds out when it writes (retransmissions time out) or when its
	// keepalive fails.
	held.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil {
		t.Errorf("the held connection delivered data after the park")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Errorf("the peer of the held connection read %v after the park; want no news (a timeout)", err)
	}

	const clones = 4
	nss := make([]*netns.NS, clones)
	outs := make([]string, clones)
	for k := range clones {
		nss[k] = newNS(k + 1)
		outs[k] = filepath.Join(dir, fmt.Sprintf("clone%d.out", k))
		id := fmt.Sprintf("clone%d", k)
		if err := r.Restore(newBundle(id, nss[k]), id, image, outs[k]); err != nil {
			t.Fatal(err)
		}
	}
	for k := range clones {
		c := kvclient.New(nss[k].GuestIP)
		if got, err := c.Get("origin"); err != nil || got != "source" {
			t.Errorf("clone %d: origin=%q (%v), want the parked sandbox's %q", k, got, err, "source")
		}
		got := whoami(t, c)
		if !strings.Contains(got, nss[k].GuestIP+"/24") || strings.Contains(got, srcNS.GuestIP) {
			t.Errorf("clone %d: addresses %q, want its own %s and not the parked sandbox's %s", k, got, nss[k].GuestIP, srcNS.GuestIP)
		}
		if err := c.Set("mine", fmt.Sprintf("clone%d", k)); err != nil {
			t.Fatal(err)
		}
	}
	for k := range clones {
		got, err := kvclient.New(nss[k].GuestIP).Get("mine")
		if want := fmt.Sprintf("clone%d", k); err != nil || got != want {
			t.Errorf("clone %d: mine=%q (%v), want its own write %q", k, got, err, want)
		}
		// What the workload sees of the connection it held when parked:
		// runsc closed it at the park (--allow-connected-on-save is off by default), and
		// the clone reads end of file.
		if line, _ := waitLine(t, outs[k], 0, "held n=0 ended: "); line != "held n=0 ended: EOF" {
			t.Errorf("clone %d: %q, want the held connection to end with EOF", k, line)
		}
	}
}

// waitLine waits for a line of the output file out, from line index from,
// that starts with prefix, and returns it and its index (as waitTick does).
func waitLine(t *testing.T, out string, from int, prefix string) (string, int) {
	t.Helper()
	l, idx, err := sandbox.WaitForLine(out, from, 30*time.Second, func(l string) bool { return strings.HasPrefix(l, prefix) })
	if err != nil {
		t.Fatal(err)
	}
	return l, idx
}

// whoami returns the addresses of the kvserver that c talks to.
func whoami(t *testing.T, c *kvclient.Client) string {
	t.Helper()
	got, err := c.Whoami()
	if err != nil {
		t.Fatal(err)
	}
	return got
}
