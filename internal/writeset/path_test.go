package writeset

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/forkvisor/forkvisor/internal/basestore"
)

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		name string
		// image: "link" (a hard link of the stored base.img), "own" (a
		// base.img of its own), "none" (no base.img).
		image   string
		stored  bool
		noStore bool
		inStore bool
	}{
		{name: "no store", image: "own", noStore: true},
		{name: "image links the stored base", image: "link", stored: true, inStore: true},
		{name: "image has no base.img, store has it", image: "none", stored: true, inStore: true},
		{name: "image has its own base.img", image: "own", stored: true},
		{name: "store entry without base.img", image: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image, entry := t.TempDir(), t.TempDir()
			if tc.stored {
				if err := os.WriteFile(filepath.Join(entry, basestore.ImageName), []byte("base"), 0o444); err != nil {
					t.Fatal(err)
				}
			}
			switch tc.image {
			case "link":
				if err := os.Link(filepath.Join(entry, basestore.ImageName), filepath.Join(image, basestore.ImageName)); err != nil {
					t.Fatal(err)
				}
			case "own":
				if err := os.WriteFile(filepath.Join(image, basestore.ImageName), []byte("base"), 0o444); err != nil {
					t.Fatal(err)
				}
			}
			if tc.noStore {
				entry = ""
			}
			want := filepath.Join(image, Name)
			if tc.inStore {
				want = filepath.Join(entry, Name)
			}
			if got := Path(image, entry); got != want {
				t.Errorf("Path = %s, want %s", got, want)
			}
		})
	}
}
