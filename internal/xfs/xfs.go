// Package xfs creates loopback XFS filesystems with reflink for tests and
// benchmarks (the root filesystem here is ext4, which has no FICLONE).
package xfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// BytesWritten returns how many bytes the block device under fs has written
// since it was attached (the sectors written in its /sys/dev/block stat).
func (fs *FS) BytesWritten() (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fs.Dir, &st); err != nil {
		return 0, err
	}
	path := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// Fields: read I/Os, read merges, sectors read, read ticks, write I/Os,
	// write merges, sectors written, ... (Documentation/block/stat.rst);
	// a sector is 512 bytes whatever the device's block size.
	fields := strings.Fields(string(b))
	if len(fields) < 7 {
		return 0, fmt.Errorf("%s: %d fields, want at least 7", path, len(fields))
	}
	sectors, err := strconv.ParseInt(fields[6], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: sectors written: %w", path, err)
	}
	return sectors * 512, nil
}
