package ociartifact

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/ociregistry"
	"github.com/forkvisor/forkvisor/internal/prereq"
)

// registry starts Debian's registry on loopback (no authentication).
func registry(t *testing.T) *ociregistry.Registry {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := ociregistry.Binary(root)
	if _, err := os.Stat(bin); err != nil {
		prereq.Missing(t, "no OCI registry (run tools/setup.sh): %v", err)
	}
	reg, err := ociregistry.Start(bin, t.TempDir(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	return reg
}

var opts = Options{PlainHTTP: true}

// TestPushPullPlainCheckpoint pushes a checkpoint without a shared base and
// pulls it back byte for byte.
func TestPushPullPlainCheckpoint(t *testing.T) {
	reg := registry(t)
	src := t.TempDir()
	files := map[string][]byte{"checkpoint.img": []byte("state"), "pages.img": bytes.Repeat([]byte{7}, 1<<20), "pages_meta.img": []byte("meta")}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(src, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ref := reg.Addr + "/plain/ckpt:v1"
	if _, err := Push(context.Background(), src, "", ref, opts); err != nil {
		t.Fatalf("Push: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "image")
	res, err := Pull(context.Background(), ref, dst, BaseStore{Root: t.TempDir()}, opts)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if res.BaseDigest != "" || len(res.Files) != len(files) {
		t.Errorf("Pull = %+v; want %d files and no base", res, len(files))
	}
	for name, want := range files {
		if got, err := os.ReadFile(filepath.Join(dst, name)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s after pull: %d bytes, %v; want %d bytes equal to the pushed ones", name, len(got), err, len(want))
		}
	}
	if _, err := Pull(context.Background(), ref, dst, BaseStore{Root: t.TempDir()}, opts); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("Pull into an existing directory: %v", err)
	}
}

// pushManifest pushes a manifest of artifactType with the given file layers
// (title -> content), subject and annotations, and tags it.
func pushManifest(t *testing.T, reg *ociregistry.Registry, tag, artifactType string, layers map[string][]byte, subject *ocispec.Descriptor, annotations map[string]string) string {
	t.Helper()
	ctx := context.Background()
	ref := reg.Addr + "/evil/ckpt:" + tag
	repo, err := Repository(ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	pack := oras.PackManifestOptions{Subject: subject, ManifestAnnotations: annotations}
	for title, data := range layers {
		desc := content.NewDescriptorFromBytes(FileMediaType, data)
		desc.Annotations = map[string]string{ocispec.AnnotationTitle: title}
		if _, err := pushIfMissing(ctx, repo, desc, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		pack.Layers = append(pack.Layers, desc)
	}
	desc, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, artifactType, pack)
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Tag(ctx, desc, tag); err != nil {
		t.Fatal(err)
	}
	return ref
}

// pushBaseArtifact pushes a base manifest whose config is data (a block
// manifest, or not) and returns its descriptor.
func pushBaseArtifact(t *testing.T, reg *ociregistry.Registry, data []byte) ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	repo, err := Repository(reg.Addr+"/evil/ckpt", opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := content.NewDescriptorFromBytes(blockmanifest.MediaType, data)
	if _, err := pushIfMissing(ctx, repo, cfg, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	desc, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, BaseArtifactType, oras.PackManifestOptions{ConfigDescriptor: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	return desc
}

// TestPullRefuses checks that Pull refuses artifacts that are not what they
// claim, naming the reference and the reason, and leaves nothing behind.
func TestPullRefuses(t *testing.T) {
	reg := registry(t)
	// A base manifest whose blocks hash to a root that is not the one the
	// checkpoint's base.json records.
	f, err := os.CreateTemp(t.TempDir(), "base")
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(4 << 20)
	f.WriteAt([]byte("data"), 100)
	m, err := blockmanifest.Build(f, 4<<20, nil)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	baseDesc := pushBaseArtifact(t, reg, m.Encode())
	otherRoot := strings.Repeat("ab", 32)
	baseJSON := func(sha string) []byte {
		b, _ := json.Marshal(map[string]any{"version": 1, "length": 4 << 20, "sha256": sha})
		return b
	}
	rootHex := strings.TrimPrefix(m.Digest, "sha256:")
	for _, tc := range []struct {
		name         string
		artifactType string
		layers       map[string][]byte
		subject      *ocispec.Descriptor
		annotations  map[string]string
		want         string
	}{
		{"other artifact type", "application/vnd.example.thing", map[string][]byte{"checkpoint.img": []byte("x")}, nil, nil, "is not a forkvisor checkpoint"},
		{"path in a title", CheckpointArtifactType, map[string][]byte{"../escape": []byte("x")}, nil, nil, "is not a checkpoint file"},
		{"hidden title", CheckpointArtifactType, map[string][]byte{".hidden": []byte("x")}, nil, nil, "is not a checkpoint file"},
		{"base.img as a file", CheckpointArtifactType, map[string][]byte{"base.img": []byte("x")}, nil, nil, "is not a checkpoint file"},
		{"base.json without a base", CheckpointArtifactType, map[string][]byte{"base.json": baseJSON(rootHex)}, nil, nil, "the manifest names"},
		{"base.json and manifest disagree", CheckpointArtifactType, map[string][]byte{"base.json": baseJSON(otherRoot)}, &baseDesc, map[string]string{BaseDigestAnnotation: m.Digest}, "the manifest names"},
		{"block manifest for another base", CheckpointArtifactType, map[string][]byte{"base.json": baseJSON(otherRoot)}, &baseDesc, map[string]string{BaseDigestAnnotation: "sha256:" + otherRoot}, "block manifest is for base " + m.Digest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := pushManifest(t, reg, strings.ReplaceAll(tc.name, " ", "-"), tc.artifactType, tc.layers, tc.subject, tc.annotations)
			parent := t.TempDir()
			dst := filepath.Join(parent, "image")
			store := filepath.Join(t.TempDir(), "store")
			_, err := Pull(context.Background(), ref, dst, BaseStore{Root: store, Runsc: "/nonexistent/runsc"}, opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), ref) {
				t.Fatalf("Pull = %v; want an error naming %s and containing %q", err, ref, tc.want)
			}
			if left, _ := os.ReadDir(parent); len(left) != 0 {
				t.Errorf("failed pull left %v in %s", left, parent)
			}
			if left, _ := filepath.Glob(filepath.Join(store, "*")); len(left) != 0 { // "*" matches dot files too
				t.Errorf("failed pull left %v in the store", left)
			}
		})
	}
}
