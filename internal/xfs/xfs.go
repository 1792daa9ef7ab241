// Package xfs creates loopback XFS filesystems with reflink for tests and
// benchmarks (the root filesystem here is ext4, which has no FICLONE).
package xfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// FS is a mounted loopback XFS filesystem.
type FS struct {
	// Dir is the mount point.
	Dir   string
	image string
}

// Available returns "" if loopback XFS can be created here, or why not.
func Available() string {
	if os.Geteuid() != 0 {
		return "needs root to mount a loopback filesystem"
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		return "mkfs.xfs not found (install xfsprogs; `make test` does)"
	}
	return ""
}

// Mount creates a sparse image of sizeBytes under workDir, formats it as XFS
// with reflink and mounts it at workDir/mnt.
func Mount(workDir string, sizeBytes int64) (*FS, error) {
	image := filepath.Join(workDir, "xfs.img")
	dir := filepath.Join(workDir, "mnt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(image)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(sizeBytes); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	if out, err := exec.Command("mkfs.xfs", "-q", "-f", "-m", "reflink=1", image).CombinedOutput(); err != nil {
		os.Remove(image)
		return nil, fmt.Errorf("mkfs.xfs: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("mount", "-o", "loop", image, dir).CombinedOutput(); err != nil {
		os.Remove(image)
		return nil, fmt.Errorf("mount -o loop %s: %v: %s", image, err, strings.TrimSpace(string(out)))
	}
	return &FS{Dir: dir, image: image}, nil
}

// Unmount unmounts fs (lazily, so that it never fails on a busy mount) and
// removes its image.
func (fs *FS) Unmount() {
	unix.Unmount(fs.Dir, unix.MNT_DETACH)
	os.Remove(fs.image)
}
