package basestore

import "testing"

func TestEntry(t *testing.T) {
	for _, tc := range []struct {
		root, digest, want string
	}{
		{"/var/lib/bases", "sha256:ab12", "/var/lib/bases/sha256/ab12"},
		{"/var/lib/bases", "ab12", "/var/lib/bases/sha256/ab12"},
		{"", "sha256:ab12", ""},
	} {
		if got := Entry(tc.root, tc.digest); got != tc.want {
			t.Errorf("Entry(%q, %q) = %q, want %q", tc.root, tc.digest, got, tc.want)
		}
	}
}
