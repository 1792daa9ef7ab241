// Package pauselog reads how long a checkpoint paused a sandbox from the
// sandbox's runsc debug log (runsc --debug --debug-log=DIR/).
//
// Both runtimes log when the save pauses the sandbox's tasks ("Sandbox save
// started, pausing all tasks.") and when it resumes them ("Tasks resumed
// after save"), in the glog format that runsc uses: a severity letter, the
// date as MMDD, then the time of day to the microsecond. The pause is the
// time between the two lines' timestamps, the same measure for upstream's
// runsc and forkvisor's (whose resume line also states the pause itself).
package pauselog

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

const (
	pauseLine  = "Sandbox save started, pausing all tasks."
	resumeLine = "Tasks resumed after save"
)

// Dir returns the pause of the first checkpoint logged in dir: the first
// sandbox log (*.boot.txt, in name order, which is start order) that holds
// a save.
func Dir(dir string) (time.Duration, error) {
	boots, err := filepath.Glob(filepath.Join(dir, "*.boot.txt"))
	if err != nil {
		return 0, err
	}
	sort.Strings(boots)
	for _, b := range boots {
		d, ok, err := File(b)
		if err != nil {
			return 0, err
		}
		if ok {
			return d, nil
		}
	}
	return 0, fmt.Errorf("no sandbox log in %s logs a save that paused and resumed its tasks", dir)
}

// File returns the pause of the first save logged in the sandbox log at
// path, and false if it logs none that both paused and resumed.
func File(path string) (time.Duration, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	var paused time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case paused.IsZero() && strings.Contains(line, pauseLine):
			if paused, err = lineTime(line); err != nil {
				return 0, false, fmt.Errorf("%s: %w", path, err)
			}
		case !paused.IsZero() && strings.Contains(line, resumeLine):
			resumed, err := lineTime(line)
			if err != nil {
				return 0, false, fmt.Errorf("%s: %w", path, err)
			}
			if resumed.Before(paused) {
				// Across a new year: the log has no year.
				resumed = resumed.AddDate(1, 0, 0)
			}
			return resumed.Sub(paused), true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("%s: %w", path, err)
	}
	return 0, false, nil
}

// lineTime parses the timestamp of a glog line: "I1202 16:44:33.164447 ...".
func lineTime(line string) (time.Time, error) {
	fields := strings.Fields(line)
	if len(fields) < 2 || len(fields[0]) != 5 {
		return time.Time{}, fmt.Errorf("no glog timestamp in %q", line)
	}
	t, err := time.Parse("0102 15:04:05.000000", fields[0][1:]+" "+fields[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("no glog timestamp in %q: %w", line, err)
	}
	return t, nil
}
