package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// logsContain reports whether a runsc debug log under dir contains s.
func logsContain(t *testing.T, dir, s string) bool {
	t.Helper()
	return len(logLines(t, dir, s)) > 0
}

// logLines returns the lines of the runsc debug logs under dir that contain
// s.
func logLines(t *testing.T, dir, s string) []string {
	t.Helper()
	var lines []string
	for _, f := range readLogs(t, dir) {
		for _, l := range f.lines {
			if strings.Contains(l, s) {
				lines = append(lines, l)
			}
		}
	}
	return lines
}

// logFile is one debug log file of a directory, split into lines.
type logFile struct {
	name  string
	lines []string
}

// readLogs returns the files of dir (a runsc --debug-log directory), in
// name order; a file that cannot be read (removed meanwhile) is left out.
func readLogs(t testing.TB, dir string) []logFile {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []logFile
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		files = append(files, logFile{e.Name(), strings.Split(string(b), "\n")})
	}
	return files
}
