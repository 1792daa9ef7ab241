package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// errorRecorder is a testing.TB whose Errorf records instead of failing.
type errorRecorder struct {
	testing.TB
	errs []string
}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestCheckTouches runs checkTouches over log lines of the kinds that
// restores print (the late stop is the one of CI run /work/s43/ci.out): a
// touch that stopped at its deadline is allowed once per directory, after
// the probe's five pieces, and every other failure or short touch fails.
func TestCheckTouches(t *testing.T) {
	const (
		want      = 32 << 20
		populated = "I1207 02:17:44.540000       1 populate_restored.go:59] Populated the page tables of 68026368 bytes of restored memory, looking at 1 MMs, in 3.7ms"
		full      = "I1207 02:17:44.907419       1 touch_restored.go:238] Touched 68026368 bytes of restored memory from user mode, in 1 of 1 MMs, in 110.452496ms"
		short     = "I1207 02:17:44.907419       1 touch_restored.go:238] Touched 32317440 bytes of restored memory from user mode, in 1 of 1 MMs, in 167.175839ms"
		tiny      = "I1207 02:17:44.907419       1 touch_restored.go:238] Touched 262144 bytes of restored memory from user mode, in 1 of 1 MMs, in 51ms"
		lateMM2   = "W1207 02:17:44.907394       1 touch_restored.go:227] Touching restored memory of MM 2 of 2 from user mode: touching [0x3f71e1f5c000, 0x3f71e1f9c000): the switch ended with system call false, signal 17 at 0x7fe3d86911a0 (deadline passed: true, interrupts: 0)"
		lateSys   = "W1207 02:17:44.907394       1 touch_restored.go:227] Touching restored memory of MM 1 of 1 from user mode: touching [0x3f71e1f5c000, 0x3f71e1f9c000): the switch ended with system call true, signal 0 at 0x7fe3d86911a0 (deadline passed: true, interrupts: 0)"
		lateSegv  = "W1207 02:17:44.907394       1 touch_restored.go:227] Touching restored memory of MM 1 of 1 from user mode: touching [0x3f71e1f5c000, 0x3f71e1f9c000): the switch ended with system call false, signal 11 at 0x401000 (deadline passed: true, interrupts: 0)"
		probeStop = "I1207 02:17:44.907419       1 touch_restored.go:238] Touched 1310720 bytes of restored memory from user mode, in 1 of 1 MMs, in 2ms; stopped: a page's first access cost 120ns (median of the probes [110ns 120ns 130ns 125ns 118ns]): cheap on this host"
		costly    = "I1207 02:17:44.907419       1 touch_restored.go:238] Touched 1310720 bytes of restored memory from user mode, in 1 of 1 MMs, in 2ms; stopped: a page's first access cost 6us (median of the probes [5us 6us 7us 6us 6us]): cheap on this host"
		idleStop  = "I1207 02:17:44.907419       1 touch_restored.go:238] Touched 1310720 bytes of restored memory from user mode, in 1 of 1 MMs, in 40ms; stopped: the tasks ran for 12ms, then none for 25ms"
		late      = "W1207 02:17:44.907394       1 touch_restored.go:227] Touching restored memory of MM 1 of 1 from user mode: touching [0x3f71e1f5c000, 0x3f71e1f9c000): the switch ended with system call false, signal 17 at 0x7fe3d86911a0 (deadline passed: true, interrupts: 0)"
		fault     = "W1207 02:17:44.907394       1 touch_restored.go:227] Touching restored memory of MM 1 of 1 from user mode: touching [0x3f71e1f5c000, 0x3f71e1f9c000): the switch ended with system call true, signal 0 at 0x7fe3d86911a0 (deadline passed: false, interrupts: 0)"
	)
	for _, tc := range []struct {
		name     string
		restores [][]string
		// policy runs checkTouches as for restores without
		// --TESTONLY-touch-restored-always.
		policy   bool
		wantErrs []string
	}{
		{"every touch complete", [][]string{{populated, full}, {populated, full}}, false, nil},
		{"one late stop after the probe", [][]string{{populated, full}, {populated, late, short}, {populated, full}}, false, nil},
		{"two late stops", [][]string{{populated, full}, {populated, late, short}, {populated, late, short}}, false, []string{"earlier restores that stopped at their deadline: 1"}},
		{"a late stop before the probe decided", [][]string{{populated, full}, {populated, late, tiny}}, false, []string{"a restore's user-mode touch failed (262144 bytes touched"}},
		{"a failure other than the deadline", [][]string{{populated, full}, {populated, fault, short}}, false, []string{"a restore's user-mode touch failed"}},
		{"a short touch without a failure", [][]string{{populated, full}, {populated, short}}, false, []string{"want at least 33554432 and no stop"}},
		{"only the late stop populated enough", [][]string{{populated, late, short}}, false, []string{"no restore populated at least"}},
		// A switch that passed its deadline but ended otherwise than by
		// the platform's interrupt is a broken toucher, not a late one.
		{"a system call past the deadline", [][]string{{populated, full}, {populated, lateSys, short}}, false, []string{"a restore's user-mode touch failed"}},
		{"a fault outside the touch past the deadline", [][]string{{populated, full}, {populated, lateSegv, short}}, false, []string{"a restore's user-mode touch failed"}},
		// A late stop of one MM does not excuse another MM's failure.
		{"a failure and a late stop in one restore", [][]string{{populated, full}, {populated, fault, lateMM2, short}}, false, []string{"a restore's user-mode touch failed"}},
		// The policy's own stops, without --TESTONLY-touch-restored-always.
		{"policy: a cheap probe", [][]string{{populated, probeStop}}, true, nil},
		{"policy: an expensive probe", [][]string{{populated, costly}}, true, []string{"want below 1us"}},
		{"policy: idle tasks", [][]string{{populated, idleStop}}, true, nil},
		{"policy: a stop with --TESTONLY-touch-restored-always", [][]string{{populated, probeStop}}, false, []string{"want at least 33554432 and no stop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, lines := range tc.restores {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("runsc.log.%d.boot.txt", i)), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r := &errorRecorder{TB: t}
			checkTouches(r, dir, want, !tc.policy)
			if len(r.errs) != len(tc.wantErrs) {
				t.Fatalf("checkTouches reported %q; want %d errors containing %q", r.errs, len(tc.wantErrs), tc.wantErrs)
			}
			for i, w := range tc.wantErrs {
				if !strings.Contains(r.errs[i], w) {
					t.Errorf("error %d: %q; want it to contain %q", i, r.errs[i], w)
				}
			}
		})
	}
}
