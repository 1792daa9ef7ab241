package memstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// FieldKiB returns the sum of the values of the lines "NAME: N kB" whose
// NAME is name (e.g. "ShmemPmdMapped" in a process's smaps_rollup,
// "ShmemHugePages" in /proc/meminfo) in the /proc file at path. A file
// without such a line has none: FieldKiB returns an error naming the file.
func FieldKiB(path, name string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var sum uint64
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != name+":" {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		sum += n
		found = true
	}
	if !found {
		return 0, fmt.Errorf("%s has no %s", path, name)
	}
	return sum, nil
}
