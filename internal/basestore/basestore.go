// Package basestore names the files of runsc's node base store (the
// --base-store directory that `runsc checkpoint --shared-base` publishes
// into and restores look bases up in; patch 0014), for the harness and the
// tools that read it beside runsc. The layout is runsc's: one directory per
// base, named by the base's root digest, holding ImageName and the records
// runsc writes beside it.
package basestore

import (
	"path/filepath"
	"strings"
)

// ImageName is the base image's name, in a store entry and in an image
// directory alike.
const ImageName = "base.img"

// Entry returns the directory of the base with the given root digest (hex,
// with or without its "sha256:" prefix) in the store at root, or "" if
// root is "" (no store).
func Entry(root, digest string) string {
	if root == "" {
		return ""
	}
	return filepath.Join(root, "sha256", strings.TrimPrefix(digest, "sha256:"))
}
