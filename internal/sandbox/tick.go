package sandbox

import (
	"fmt"
	"strconv"
	"strings"
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
}

// ParseTick parses "tick=N mib=M sum=ok|BAD [mark=HEX]".
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
