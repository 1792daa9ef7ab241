// Package netns creates network namespaces for sandboxes that use gVisor's
// own network stack (runsc --network=sandbox): a named namespace with one
// veth pair, the host end in the caller's namespace and eth0 inside, each
// end with its own address in a /24 of its own. Traffic between the two
// never leaves the machine.
//
// It drives iproute2 (ip), which must be on PATH.
package netns

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// NS is a named network namespace joined to the caller's by a veth pair.
type NS struct {
	// Name is the namespace's name under /run/netns.
	Name string
	// Path is the namespace's bind mount, for the OCI spec's
	// linux.namespaces network path.
	Path string
	// HostIf is the host end of the veth pair.
	HostIf string
	// HostIP and GuestIP are the addresses of the host end and of eth0 in
	// the namespace, in the same /24.
	HostIP, GuestIP string
}

// Create creates namespace name with eth0 at 10.231.subnet.2/24 inside and
// hostIf at 10.231.subnet.1/24 in the caller's namespace. On failure nothing
// it created is left behind; a name or subnet in use makes it fail (callers
// that run at once choose distinct subnets).
func Create(name, hostIf string, subnet int) (*NS, error) {
	if subnet < 0 || subnet > 255 {
		return nil, fmt.Errorf("netns: subnet %d out of 0..255", subnet)
	}
	if len(hostIf) > 15 {
		return nil, fmt.Errorf("netns: interface name %q is longer than 15 bytes", hostIf)
	}
	ns := &NS{
		Name:    name,
		Path:    filepath.Join("/run/netns", name),
		HostIf:  hostIf,
		HostIP:  fmt.Sprintf("10.231.%d.1", subnet),
		GuestIP: fmt.Sprintf("10.231.%d.2", subnet),
	}
	steps := [][]string{
		{"netns", "add", name},
		{"link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"addr", "add", ns.HostIP + "/24", "dev", hostIf},
		{"link", "set", hostIf, "up"},
		{"-n", name, "addr", "add", ns.GuestIP + "/24", "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "route", "add", "default", "via", ns.HostIP},
	}
	for i, args := range steps {
		if err := ip(args...); err != nil {
			// Undo only what this call created: a name that existed
			// already belongs to someone else.
			if i > 1 {
				ip("link", "del", hostIf)
			}
			if i > 0 {
				ip("netns", "del", name)
			}
			return nil, err
		}
	}
	return ns, nil
}

// Delete removes the namespace and the veth pair (deleting either end
// deletes both).
func (ns *NS) Delete() {
	ip("link", "del", ns.HostIf)
	ip("netns", "del", ns.Name)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
