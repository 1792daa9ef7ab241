package writeset

import (
	"os"
	"path/filepath"

	"github.com/forkvisor/forkvisor/internal/basestore"
)

// Path returns where runsc keeps the write set of the base that the
// checkpoint in imageDir was saved against, given that base's entry in the
// node base store (storeEntry, "" without a store): in the store entry
// when a restore maps the stored file (the image links it, or holds no
// base.img), else beside the image's base.img. It follows runsc's rule for
// an image in a node base store or with its own base.img; a base given by
// --shared-base=PATH or served by the lazy fetcher keeps its set elsewhere.
func Path(imageDir, storeEntry string) string {
	beside := filepath.Join(imageDir, Name)
	if storeEntry == "" {
		return beside
	}
	stored, err := os.Stat(filepath.Join(storeEntry, basestore.ImageName))
	if err != nil {
		return beside
	}
	if own, err := os.Stat(filepath.Join(imageDir, basestore.ImageName)); err == nil && !os.SameFile(own, stored) {
		return beside
	}
	return filepath.Join(storeEntry, Name)
}
