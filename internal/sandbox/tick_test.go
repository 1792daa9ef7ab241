package sandbox

import (
	"strings"
	"testing"
)

func TestParseTick(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Tick
		ok   bool
	}{
		{"tick=12 mib=256 sum=ok", Tick{N: 12, MiB: 256, OK: true}, true},
		{"tick=0 mib=1 sum=BAD mark=af03", Tick{N: 0, MiB: 1, OK: false, Mark: "af03"}, true},
		{"tick=4 mib=90 sum=ok mark=0 pass_ms=212.5", Tick{N: 4, MiB: 90, OK: true, Mark: "0", PassMs: 212.5}, true},
		{"tick=4 mib=90 sum=ok pass_ms=fast", Tick{}, false},
		{"tick=x mib=1 sum=ok", Tick{}, false},
		{"hello", Tick{}, false},
		{"tick=3 sum=ok", Tick{}, false},
	} {
		got, err := ParseTick(tc.line)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseTick(%q) = %+v, %v; want %+v, ok=%t", tc.line, got, err, tc.want, tc.ok)
		}
	}
}

func TestHasArg(t *testing.T) {
	cmd := func(args ...string) []byte { return []byte(strings.Join(args, "\x00") + "\x00") }
	for _, tc := range []struct {
		cmdline []byte
		s       string
		want    bool
	}{
		{cmd("runsc", "--root", "/tmp/a/root", "run"), "/tmp/a/root", true},
		{cmd("runsc", "--root=/tmp/a/root", "run"), "/tmp/a/root", true},
		{cmd("runsc", "--log=/tmp/a/root/x.log"), "/tmp/a/root", true},
		{cmd("containerd", "--state", "/tmp/a/root/state"), "/tmp/a/root", true},
		{cmd("runsc", "--root", "/tmp/a/root2", "run"), "/tmp/a/root", false},
		{cmd("runsc", "--root=/tmp/a/root2"), "/tmp/a/root", false},
		{cmd("sh", "-c", "echo /tmp/a/root"), "/tmp/a/root", false},
	} {
		if got := hasArg(tc.cmdline, tc.s); got != tc.want {
			t.Errorf("hasArg(%q, %q) = %t, want %t", tc.cmdline, tc.s, got, tc.want)
		}
	}
}
