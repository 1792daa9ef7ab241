package prereq

import "testing"

func TestInCI(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want bool
	}{{"true", true}, {"", false}, {"1", false}, {"false", false}} {
		t.Setenv("CI", tc.env)
		if got := InCI(); got != tc.want {
			t.Errorf("CI=%q: InCI() = %t, want %t", tc.env, got, tc.want)
		}
	}
}
