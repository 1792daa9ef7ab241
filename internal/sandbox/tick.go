package sandbox

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tick is one line of the tick workload's output.
type Tick struct {
	N    int
	MiB  int
	OK   bool
	Mark string // "0" until marked
	// File and FileMark are the -file status ("ok", "BAD"; "" without
	// -file) and mark.
	File     string
	FileMark string
	// PassMs is how long the pass over the state that the line reports
	// took, in the guest, in milliseconds (pyagent's pass_ms; 0 if the
	// line has none).
	PassMs float64
}

// ParseTick parses "tick=N mib=M sum=ok|BAD [mark=HEX] [pass_ms=MS]".
func ParseTick(line string) (Tick, error) {
	var t Tick
	seen := 0
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "tick":
			t.N, err = strconv.Atoi(v)
			seen++
		case "mib":
			t.MiB, err = strconv.Atoi(v)
			seen++
		case "sum":
			t.OK = v == "ok"
			seen++
		case "mark":
			t.Mark = v
		case "file":
			t.File = v
		case "filemark":
			t.FileMark = v
		case "pass_ms":
			t.PassMs, err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			return Tick{}, fmt.Errorf("tick line %q: %w", line, err)
		}
	}
	if seen != 3 {
		return Tick{}, fmt.Errorf("not a tick line: %q", line)
	}
	return t, nil
}

// IsTick reports whether line is a tick line.
func IsTick(line string) bool {
	_, err := ParseTick(line)
	return err == nil
}

// RunUntilTick runs container id from bundle, detached with its output in
// out, and waits until it prints a tick numbered n or more, for which ok
// (if not nil) also holds. A tick with a bad heap checksum fails it.
func (r *Runsc) RunUntilTick(bundle, id, out string, n int, ok func(Tick) bool) (Tick, error) {
	if err := r.Run(bundle, id, out); err != nil {
		return Tick{}, err
	}
	t, _, err := WaitTick(out, 0, 300*time.Second, func(t Tick) bool { return t.N >= n && (ok == nil || ok(t)) })
	return t, err
}

// RestoreFirstTick restores container id from imageDir into bundle (extra
// restore flags allowed), detached with its output in out, and waits for
// its first tick line. It returns that tick and the time from the start of
// `runsc restore` to the line (polled every millisecond); a first tick with a
// bad heap checksum is an error.
func (r *Runsc) RestoreFirstTick(bundle, id, imageDir, out string, extra ...string) (Tick, time.Duration, error) {
	start := time.Now()
	if err := r.Restore(bundle, id, imageDir, out, extra...); err != nil {
		return Tick{}, 0, err
	}
	t, err := WaitFirstTick(out, start)
	return t, time.Since(start), err
}

// WaitFirstTick waits for the first tick line in out, polling every
// millisecond, for at most 300 s after since. A first tick with a bad heap
// checksum is an error.
func WaitFirstTick(out string, since time.Time) (Tick, error) {
	line, _, err := WaitForLineEvery(out, 0, 300*time.Second-time.Since(since), time.Millisecond, IsTick)
	if err != nil {
		return Tick{}, err
	}
	t, err := ParseTick(line)
	if err == nil && !t.OK {
		err = fmt.Errorf("%s: heap checksum BAD at tick %d", out, t.N)
	}
	return t, err
}

// WaitTick waits for a tick line in out, at line index from or later, that
// satisfies match, and returns it and its index. A tick with a bad heap
// checksum ends the wait with an error.
func WaitTick(out string, from int, timeout time.Duration, match func(Tick) bool) (Tick, int, error) {
	var got Tick
	_, idx, err := WaitForLine(out, from, timeout, func(l string) bool {
		t, err := ParseTick(l)
		if err != nil {
			return false
		}
		if !t.OK || match(t) {
			got = t
			return true
		}
		return false
	})
	if err != nil {
		return Tick{}, 0, err
	}
	if !got.OK {
		return got, idx, fmt.Errorf("%s: heap checksum BAD at tick %d", out, got.N)
	}
	return got, idx, nil
}
