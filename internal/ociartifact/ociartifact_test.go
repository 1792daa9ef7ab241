package ociartifact

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/forkvisor/forkvisor/internal/basestore"
	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/lazybase"
	"github.com/forkvisor/forkvisor/internal/ociregistry"
	"github.com/forkvisor/forkvisor/internal/prereq"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// registry starts Debian's registry on loopback (no authentication).
func registry(t *testing.T) *ociregistry.Registry {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return ociregistry.StartForTest(t, root, "", "")
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
		{"base manifest with a layer that is not a block", CheckpointArtifactType, map[string][]byte{"base.json": baseJSON(rootHex)}, &baseDesc, map[string]string{BaseDigestAnnotation: m.Digest}, "which is not a block of the base"},
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
	// Without a node base store there is nowhere to put a base or its
	// write set: refused before anything is fetched.
	dst := filepath.Join(t.TempDir(), "image")
	if _, err := Pull(context.Background(), reg.Addr+"/none:v1", dst, BaseStore{Runsc: "/nonexistent/runsc"}, opts); err == nil || !strings.Contains(err.Error(), "needs a node base store") {
		t.Errorf("Pull without a base store = %v; want an error saying it needs one", err)
	}
}

// syntheticImage writes an image directory holding a base (a data block, a
// zero block and a repeat of the data block, then a short block), a base.json
// naming digest (the base's own if empty) and a checkpoint file.
func syntheticImage(t *testing.T, digest string) (string, *blockmanifest.Manifest) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, basestore.ImageName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const length = 3*blockmanifest.BlockSize + 8192
	block := bytes.Repeat([]byte("forkvisor block "), blockmanifest.BlockSize/16)
	for _, err := range []error{
		f.Truncate(length),
		writeAt(f, block, 0),
		writeAt(f, block, 2*blockmanifest.BlockSize),
		writeAt(f, []byte("tail"), 3*blockmanifest.BlockSize),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	m, err := blockmanifest.Build(f, length, nil)
	if err != nil {
		t.Fatal(err)
	}
	if digest == "" {
		digest = m.Digest
	}
	d, _ := json.Marshal(map[string]any{"version": 1, "length": length, "sha256": strings.TrimPrefix(digest, "sha256:")})
	if err := os.WriteFile(filepath.Join(dir, baseDescriptorName), d, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("state"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

func writeAt(f *os.File, b []byte, off int64) error {
	_, err := f.WriteAt(b, off)
	return err
}

// TestPushRefusesAMismatchedBase checks that a base that does not hash to
// the digest in base.json is not pushed under the tag.
func TestPushRefusesAMismatchedBase(t *testing.T) {
	reg := registry(t)
	dir, m := syntheticImage(t, "sha256:"+strings.Repeat("ab", 32))
	ref := reg.Addr + "/mismatch/ckpt:v1"
	if _, err := Push(context.Background(), dir, "", ref, opts); err == nil || !strings.Contains(err.Error(), "hashes to "+m.Digest) {
		t.Fatalf("Push of a mismatched base = %v", err)
	}
	repo, err := Repository(ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Resolve(context.Background(), "v1"); err == nil {
		t.Errorf("the tag exists after a refused push")
	}
}

// TestPullBaseFailuresLeaveNothing pulls a checkpoint with a base into cold
// stores and makes the base's storing fail in different ways: nothing may be
// left in the store or beside the image directory.
func TestPullBaseFailuresLeaveNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Missing(t, "needs root (a stored base is owned by root)")
	}
	reg := registry(t)
	dir, m := syntheticImage(t, "")
	ref := reg.Addr + "/failures/ckpt:v1"
	res, err := Push(context.Background(), dir, "", ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Block 2 repeats block 0: one upload.
	if res.Blocks != 4 || res.ZeroBlocks != 1 || res.BlocksPushed != 2 {
		t.Errorf("Push = %+v; want 4 blocks, 1 zero, 2 distinct uploaded", res)
	}
	pull := func(t *testing.T, runsc, want string) {
		t.Helper()
		parent := t.TempDir()
		store := filepath.Join(t.TempDir(), "store")
		_, err := Pull(context.Background(), ref, filepath.Join(parent, "image"), BaseStore{Root: store, Runsc: runsc}, opts)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), ref) {
			t.Errorf("Pull = %v; want an error naming %s and containing %q", err, ref, want)
		}
		if left, _ := filepath.Glob(filepath.Join(parent, "*")); len(left) != 0 { // "*" matches dot files too
			t.Errorf("failed pull left %v beside the image", left)
		}
		if left, _ := filepath.Glob(filepath.Join(store, "*")); len(left) != 0 {
			t.Errorf("failed pull left %v in the store", left)
		}
	}
	t.Run("store refuses", func(t *testing.T) {
		pull(t, "/nonexistent/runsc", "runsc bases import")
	})
	t.Run("tampered block", func(t *testing.T) {
		path := reg.BlobPath(m.Blocks[0])
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		bad := bytes.Clone(orig)
		bad[12345] ^= 1
		if err := os.WriteFile(path, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.WriteFile(path, orig, 0o644)
		pull(t, "/nonexistent/runsc", "base block 0 ("+m.Blocks[0]+")")
	})
}

// TestPushPullCarriesWriteSet checks that a complete write set of the base
// beside base.img travels with the checkpoint, and that a lazy pull hands it
// to the node's lazy fetcher, not to the image directory; a set that is not
// a complete one of this base stays behind.
func TestPushPullCarriesWriteSet(t *testing.T) {
	reg := registry(t)
	dir0, m := syntheticImage(t, "")
	d, valid := writeSetOfImage(t, dir0)
	for _, tc := range []struct {
		name string
		// data is the write set beside base.img; nil for none.
		data []byte
		// want is what pull finds in the lazy fetcher's entry; nil for
		// nothing. skipped is in push's reason for leaving a set behind.
		want    []byte
		skipped string
	}{
		{name: "none"},
		{name: "complete", data: valid, want: valid},
		{name: "being learned (empty)", data: []byte{}, skipped: "still being learned"},
		{name: "torn", data: valid[:len(valid)-1], skipped: "checksum mismatch"},
		{name: "another base's", data: writeset.Encode(d.Length, make([]byte, 32), nil), skipped: "not for base"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := syntheticImage(t, "")
			if tc.data != nil {
				if err := os.WriteFile(filepath.Join(dir, writeSetName), tc.data, 0o444); err != nil {
					t.Fatal(err)
				}
			}
			ref := reg.Addr + "/writeset/ckpt:" + strings.NewReplacer(" ", "-", "(", "", ")", "", "'", "").Replace(tc.name)
			pushed, err := Push(context.Background(), dir, "", ref, opts)
			if err != nil {
				t.Fatalf("Push: %v", err)
			}
			if pushed.WriteSetBytes != int64(len(tc.want)) || !strings.Contains(pushed.WriteSetSkipped, tc.skipped) || (tc.skipped == "") != (pushed.WriteSetSkipped == "") {
				t.Errorf("Push carried a write set of %d bytes (left one behind: %q), want %d (%q)", pushed.WriteSetBytes, pushed.WriteSetSkipped, len(tc.want), tc.skipped)
			}
			store := t.TempDir()
			image := filepath.Join(t.TempDir(), "image")
			res, err := Pull(context.Background(), ref, image, BaseStore{Root: store}, Options{PlainHTTP: true, Lazy: true})
			if err != nil {
				t.Fatalf("Pull --lazy: %v", err)
			}
			hex := strings.TrimPrefix(m.Digest, "sha256:")
			got, err := os.ReadFile(filepath.Join(store, lazybase.CacheDir, hex, writeSetName))
			switch {
			case tc.want == nil && (err == nil || res.WriteSet != ""):
				t.Errorf("the lazy fetcher's entry has a write set (%d bytes, pull said %q), want none", len(got), res.WriteSet)
			case tc.want != nil && (err != nil || !bytes.Equal(got, tc.want) || res.WriteSet != "installed"):
				t.Errorf("the lazy fetcher's entry has a write set of %d bytes (%v), pull said %q; want the %d pushed, installed", len(got), err, res.WriteSet, len(tc.want))
			}
			if _, err := os.Lstat(filepath.Join(image, writeSetName)); err == nil {
				t.Errorf("pull wrote %s into the image directory; it belongs to the node's base", writeSetName)
			}
		})
	}
}

// TestPullIgnoresBadWriteSets pushes checkpoints whose write set layers are
// not what a write set of their base must be: each pull succeeds, installs
// nothing, and says why.
func TestPullIgnoresBadWriteSets(t *testing.T) {
	reg := registry(t)
	dir, m := syntheticImage(t, "")
	d, valid := writeSetOfImage(t, dir)
	if _, err := Push(context.Background(), dir, "", reg.Addr+"/badws/ckpt:base", opts); err != nil {
		t.Fatal(err)
	}
	repo, err := Repository(reg.Addr+"/badws/ckpt", opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good, err := repo.Resolve(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(mustFetch(t, repo, good), &man); err != nil {
		t.Fatal(err)
	}
	layer := func(data []byte, size int64) ocispec.Descriptor {
		desc := content.NewDescriptorFromBytes(WriteSetMediaType, data)
		desc.Annotations = map[string]string{ocispec.AnnotationTitle: writeSetName}
		if _, err := pushIfMissing(ctx, repo, desc, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		desc.Size = size
		return desc
	}
	other := writeset.Encode(d.Length, make([]byte, 32), nil)
	for _, tc := range []struct {
		name   string
		layers []ocispec.Descriptor
		want   string
	}{
		{"another base's", []ocispec.Descriptor{layer(other, int64(len(other)))}, "ignored: write set is not for base"},
		{"two of them", []ocispec.Descriptor{layer(valid, int64(len(valid))), layer(other, int64(len(other)))}, "more than one write set layer"},
		{"declares too much", []ocispec.Descriptor{layer(valid, writeset.MaxBytes+1)}, "declares"},
		{"not served as declared", []ocispec.Descriptor{layer(valid, int64(len(valid))-1)}, "ignored: fetching it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pack := oras.PackManifestOptions{Subject: man.Subject, ManifestAnnotations: man.Annotations, Layers: append(slices.Clone(man.Layers), tc.layers...)}
			desc, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, CheckpointArtifactType, pack)
			if err != nil {
				t.Fatal(err)
			}
			tag := strings.ReplaceAll(tc.name, " ", "-")
			tag = strings.ReplaceAll(tag, "'", "")
			if err := repo.Tag(ctx, desc, tag); err != nil {
				t.Fatal(err)
			}
			store := t.TempDir()
			res, err := Pull(ctx, reg.Addr+"/badws/ckpt:"+tag, filepath.Join(t.TempDir(), "image"), BaseStore{Root: store}, Options{PlainHTTP: true, Lazy: true})
			if err != nil {
				t.Fatalf("Pull: %v", err)
			}
			if !strings.Contains(res.WriteSet, tc.want) {
				t.Errorf("Pull said of the write set %q, want %q", res.WriteSet, tc.want)
			}
			if _, err := os.Stat(filepath.Join(store, lazybase.CacheDir, strings.TrimPrefix(m.Digest, "sha256:"), writeSetName)); err == nil {
				t.Errorf("a write set was installed")
			}
		})
	}
}

// writeSetOfImage returns the base descriptor of the image in dir and a
// valid write set of that base.
func writeSetOfImage(t *testing.T, dir string) (*baseDescriptor, []byte) {
	t.Helper()
	d, _, err := readBaseDescriptor(filepath.Join(dir, baseDescriptorName))
	if err != nil {
		t.Fatal(err)
	}
	return d, writeset.Encode(d.Length, d.id(), [][2]uint64{{0, 4096}})
}

func mustFetch(t *testing.T, repo *remote.Repository, desc ocispec.Descriptor) []byte {
	t.Helper()
	b, err := content.FetchAll(context.Background(), repo, desc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPushRefusesRefusedImage: an image directory that runsc marked refused
// (refused.txt) is not pushed, and the error says why, before any registry
// is contacted.
func TestPushRefusesRefusedImage(t *testing.T) {
	src := t.TempDir()
	for name, data := range map[string]string{"checkpoint.img": "state", "pages.img": "pages", "pages_meta.img": "meta", "refused.txt": "runsc refused this checkpoint: it names another base.\n"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Push(context.Background(), src, "", "127.0.0.1:1/refused/ckpt:v1", opts)
	if err == nil || !strings.Contains(err.Error(), "marked refused") || !strings.Contains(err.Error(), "it names another base") {
		t.Fatalf("Push of a refused image: %v; want a refusal quoting refused.txt", err)
	}
	// A mark that cannot be read refuses too.
	if err := os.Remove(filepath.Join(src, "refused.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "refused.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Push(context.Background(), src, "", "127.0.0.1:1/refused/ckpt:v1", opts); err == nil || !strings.Contains(err.Error(), "may be marked refused") {
		t.Fatalf("Push with an unreadable refused.txt: %v; want a refusal", err)
	}
}
