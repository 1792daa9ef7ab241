// Package ociimage writes a minimal OCI image layout tarball (one layer
// holding one static binary) that `ctr images import` accepts, so tests need
// no registry.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

func digestOf(b []byte) string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256(b))
}

// Write writes to out an OCI image named ref whose root filesystem holds
// binary at /workload and whose entrypoint is /workload args....
func Write(out io.Writer, ref, binary string, args ...string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	// The layer: a gzipped tar with /workload and /tmp.
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	mod := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: mod}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "workload", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin)), ModTime: mod}); err != nil {
		return err
	}
	if _, err := tw.Write(bin); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	diffID := digestOf(layerTar.Bytes())
	var layerGz bytes.Buffer
	gz := gzip.NewWriter(&layerGz)
	if _, err := gz.Write(layerTar.Bytes()); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	layer := layerGz.Bytes()

	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": append([]string{"/workload"}, args...),
			"Env":        []string{"PATH=/"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digestOf(config), Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", Digest: digestOf(layer), Size: int64(len(layer))}},
	})
	if err != nil {
		return err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []descriptor{{
			MediaType:   "application/vnd.oci.image.manifest.v1+json",
			Digest:      digestOf(manifest),
			Size:        int64(len(manifest)),
			Annotations: map[string]string{"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref},
			Platform:    map[string]string{"architecture": "amd64", "os": "linux"},
		}},
	})
	if err != nil {
		return err
	}

	otw := tar.NewWriter(out)
	add := func(name string, b []byte) error {
		if err := otw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: mod}); err != nil {
			return err
		}
		_, err := otw.Write(b)
		return err
	}
	for _, f := range []struct {
		name string
		b    []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"blobs/sha256/" + digestOf(config)[7:], config},
		{"blobs/sha256/" + digestOf(manifest)[7:], manifest},
		{"blobs/sha256/" + digestOf(layer)[7:], layer},
	} {
		if err := add(f.name, f.b); err != nil {
			return err
		}
	}
	return otw.Close()
}
