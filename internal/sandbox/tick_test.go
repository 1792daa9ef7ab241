package sandbox

import "testing"

func TestParseTick(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Tick
		ok   bool
	}{
		{"tick=12 mib=256 sum=ok", Tick{N: 12, MiB: 256, OK: true}, true},
		{"tick=0 mib=1 sum=BAD mark=af03", Tick{N: 0, MiB: 1, OK: false, Mark: "af03"}, true},
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
