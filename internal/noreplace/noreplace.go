// Package noreplace writes files that appear whole or not at all, and never
// replace an existing file.
package noreplace

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteFile creates path holding data with permissions perm, synced, unless
// path exists; it says whether it created it. The data goes into a
// temporary file in path's directory, which is then renamed to path
// without replacing (RENAME_NOREPLACE), so a reader never sees a partial
// file and a file created meanwhile by someone else is kept.
func WriteFile(path string, data []byte, perm os.FileMode) (bool, error) {
	if _, err := os.Lstat(path); err == nil {
		return false, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp.Name(), unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}
