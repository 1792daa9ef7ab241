// Package ociartifact moves parked sandboxes between nodes through an OCI
// registry, with oras-go.
//
// A parked sandbox (`runsc checkpoint --shared-base`) becomes two artifacts:
//
//   - The base: an OCI 1.1 image manifest of artifact type
//     BaseArtifactType whose config is the base's block manifest
//     (package blockmanifest: 2 MiB blocks, SHA-256 each, zero blocks
//     marked, the root = the digest the checkpoint records) and whose layers
//     are the distinct non-zero blocks, one blob per block. A block's blob
//     digest is the SHA-256 the block manifest lists, so the registry
//     deduplicates blocks across bases (a clone parked again shares most of
//     its base's blocks) and a fetched block is verified by its digest.
//   - The checkpoint: a manifest of artifact type CheckpointArtifactType
//     whose layers are the files of the image directory except the base
//     (each titled with its file name), whose subject is the base manifest,
//     and which carries the base digest as BaseDigestAnnotation. The
//     reference (tag) names this manifest. When the parking node has
//     learned the base's write set (the pages its clones write right after
//     a restore), it rides along as a layer of WriteSetMediaType titled
//     base.writeset: a node that cannot learn one itself (a lazy node,
//     whose base is read-only) or has not yet (a cold node) applies it
//     from its first restore.
//
// Pull is content-addressed: it fetches the checkpoint files, and the base
// only if the node base store does not hold its digest yet; every blob is
// verified against its digest before it is written, the block manifest
// against the digest recorded in the checkpoint's base.json, and the base as
// a whole again by `runsc bases import` before the store accepts it. Nothing
// is left half-written: files land in temporary directories that are renamed
// into place (or removed) at the end.
//
// Credentials come from the Docker configuration file (DOCKER_CONFIG or
// ~/.docker/config.json, including credential helpers).
package ociartifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/retry"

	"github.com/forkvisor/forkvisor/internal/basestore"
	"github.com/forkvisor/forkvisor/internal/blockmanifest"
	"github.com/forkvisor/forkvisor/internal/lazybase"
	"github.com/forkvisor/forkvisor/internal/noreplace"
	"github.com/forkvisor/forkvisor/internal/writeset"
)

// Artifact and media types, and annotations.
const (
	BaseArtifactType       = "application/vnd.forkvisor.base.v1"
	BlockMediaType         = "application/vnd.forkvisor.base.block.v1"
	CheckpointArtifactType = "application/vnd.forkvisor.checkpoint.v1"
	FileMediaType          = "application/vnd.forkvisor.checkpoint.file.v1"
	// WriteSetMediaType is the base's write set (runsc's base.writeset).
	WriteSetMediaType = "application/vnd.forkvisor.base.writeset.v1"
	// BaseDigestAnnotation holds the base digest ("sha256:<hex>") on both
	// manifests.
	BaseDigestAnnotation = "dev.forkvisor.base.digest"
)

// Names in a checkpoint image directory (runsc/sharedbase in the fork).
const (
	baseDescriptorName     = "base.json"
	writeSetName           = writeset.Name
	filestoresExternalName = "filestores-external.json"
	refusedName            = "refused.txt"
)

// fixedCreated makes manifests reproducible: the same content gives the same
// manifest digest.
const fixedCreated = "1970-01-01T00:00:00Z"

// fetchWorkers is the number of blobs fetched or pushed at once.
const fetchWorkers = 4

// Limits on what Pull accepts from a registry, checked before anything is
// fetched: a registry is trusted to serve bytes that hash to the digests it
// is asked for, not to bound their size.
const (
	// MaxBaseBytes is the largest base length accepted.
	MaxBaseBytes = 1 << 40
	// maxManifestBytes bounds a manifest (common registries refuse larger
	// ones).
	maxManifestBytes = 4 << 20
	// pageSize is the granularity of base lengths.
	pageSize = 4096
)

// Options are the options of Push and Pull.
type Options struct {
	// PlainHTTP talks HTTP instead of HTTPS (a registry on loopback).
	PlainHTTP bool
	// Progress, if not nil, receives a progress bar for base blocks (pass a
	// terminal; nil is quiet).
	Progress io.Writer
	// Lazy makes Pull register a base that the node store lacks with the
	// node's lazy fetcher (package lazybase) instead of fetching it: a
	// restore then starts at once and the fetcher fetches, verifies and
	// keeps each block on its first touch.
	Lazy bool
}

// Repository returns the repository of ref ("host[:port]/name[:tag]") with
// credentials from the Docker configuration file.
func Repository(ref string, opts Options) (*remote.Repository, error) {
	repo, err := remote.NewRepository(ref)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %w", ref, err)
	}
	creds, err := credentials.NewStoreFromDocker(credentials.StoreOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the Docker configuration for credentials: %w", err)
	}
	repo.PlainHTTP = opts.PlainHTTP
	// Registries without the referrers API (distribution 2.8, for one) keep
	// a referrers index under a tag, and oras deletes the superseded index
	// on every new referrer; deletes are off by default on such registries
	// and for push-only credentials. Leave old indexes to the registry's GC.
	repo.SkipReferrersGC = true
	repo.Client = &auth.Client{
		Client:     retry.DefaultClient,
		Cache:      auth.NewCache(),
		Credential: credentials.Credential(creds),
	}
	return repo, nil
}

// baseDescriptor is the part of an image's base.json that Push and Pull use.
type baseDescriptor struct {
	Version int    `json:"version"`
	Length  uint64 `json:"length"`
	SHA256  string `json:"sha256"`
}

// id returns the base's ID as runsc records it: the digest's bytes
// (readBaseDescriptor checked that SHA256 is a hex digest).
func (d *baseDescriptor) id() []byte {
	id, _ := hex.DecodeString(d.SHA256)
	return id
}

// readBaseDescriptor reads and checks the base.json at path and returns it
// with its bytes.
func readBaseDescriptor(path string) (*baseDescriptor, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var d baseDescriptor
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if d.Version != 1 {
		return nil, nil, fmt.Errorf("%s: version %d, want 1", path, d.Version)
	}
	if id, err := hex.DecodeString(d.SHA256); err != nil || len(id) != sha256.Size || hex.EncodeToString(id) != d.SHA256 {
		return nil, nil, fmt.Errorf("%s: sha256 %q is not a lowercase hex digest", path, d.SHA256)
	}
	if d.Length == 0 || d.Length%pageSize != 0 || d.Length > MaxBaseBytes {
		return nil, nil, fmt.Errorf("%s: base length %d is not a positive multiple of %d up to %d", path, d.Length, pageSize, uint64(MaxBaseBytes))
	}
	return &d, data, nil
}

// PushResult says what Push did.
type PushResult struct {
	// Manifest is the checkpoint manifest that the reference names.
	Manifest ocispec.Descriptor
	// BaseManifest is the base manifest.
	BaseManifest ocispec.Descriptor
	// BaseDigest is the base digest, "sha256:<hex>".
	BaseDigest string
	// Blocks, ZeroBlocks: blocks of the base, and those that are all zeroes
	// (never pushed). BlocksPushed: blocks uploaded; the rest were in the
	// registry already.
	Blocks, ZeroBlocks, BlocksPushed int
	// BytesPushed counts the block and file blobs uploaded (not the
	// manifests and the block manifest config blob).
	BytesPushed int64
	// WriteSetBytes is the size of the base write set pushed with the
	// checkpoint, 0 if none was; WriteSetSkipped says why a write set
	// found on the node was not pushed.
	WriteSetBytes   int64
	WriteSetSkipped string
}

// pushWriteSet pushes the write set at path as a layer if it is a complete
// write set of the base d describes (writeset.Check); it returns its
// descriptor (nil if none was pushed), the bytes uploaded, and why a set
// found at path was not pushed. A set still being learned, or torn by a
// learner writing it right now, is left behind: the receiving node then
// learns its own.
func pushWriteSet(ctx context.Context, repo *remote.Repository, path string, d *baseDescriptor) (*ocispec.Descriptor, int64, string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, "", nil
	}
	if err != nil {
		return nil, 0, "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, writeset.MaxBytes+1))
	if err != nil {
		return nil, 0, "", fmt.Errorf("%s: %w", path, err)
	}
	if !writeset.Complete(data) {
		return nil, 0, path + " is still being learned", nil
	}
	if err := writeset.Check(data, d.Length, d.id()); err != nil {
		return nil, 0, fmt.Sprintf("%s: %v", path, err), nil
	}
	desc := content.NewDescriptorFromBytes(WriteSetMediaType, data)
	desc.Annotations = map[string]string{ocispec.AnnotationTitle: writeSetName}
	pushed, err := pushIfMissing(ctx, repo, desc, bytes.NewReader(data))
	if err != nil {
		return nil, 0, "", err
	}
	if !pushed {
		return &desc, 0, "", nil
	}
	return &desc, desc.Size, "", nil
}

// Push pushes the checkpoint in imageDir to ref. A checkpoint saved with
// --shared-base is pushed as two artifacts (see the package comment): its
// base is imageDir/base.img or, without it, the base with the checkpoint's
// digest in the node base store at storeRoot, and it is hashed as it is
// pushed; nothing is tagged unless it hashes to the digest the checkpoint
// records. Any other checkpoint is pushed as one artifact of its files.
func Push(ctx context.Context, imageDir, storeRoot, ref string, opts Options) (_ *PushResult, err error) {
	defer explain(&err, ref)
	d, descriptor, err := readBaseDescriptor(filepath.Join(imageDir, baseDescriptorName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if why, err := os.ReadFile(filepath.Join(imageDir, refusedName)); err == nil {
		return nil, fmt.Errorf("%s is marked refused by %s (%s): a restore would refuse it, so it is not pushed", imageDir, refusedName, strings.Join(strings.Fields(string(why)), " "))
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s may be marked refused: reading %s: %w", imageDir, refusedName, err)
	}
	if _, err := os.Stat(filepath.Join(imageDir, filestoresExternalName)); err == nil {
		return nil, fmt.Errorf("%s keeps its writable layers outside the image (%s); push does not carry filestore snapshots, so the image could not be restored elsewhere", imageDir, filestoresExternalName)
	}
	repo, err := Repository(ref, opts)
	if err != nil {
		return nil, err
	}
	if err := repo.Reference.ValidateReferenceAsTag(); err != nil {
		return nil, fmt.Errorf("reference %q: push needs a tag: %w", ref, err)
	}
	tag := repo.Reference.Reference
	res := &PushResult{}
	pack := oras.PackManifestOptions{ManifestAnnotations: map[string]string{ocispec.AnnotationCreated: fixedCreated}}
	if d != nil {
		if err := pushBase(ctx, repo, imageDir, storeRoot, ref, d, opts, res); err != nil {
			return nil, err
		}
		pack.Subject = &res.BaseManifest
		pack.ManifestAnnotations[BaseDigestAnnotation] = res.BaseDigest
		// The base.json that was checked, not whatever the file holds now.
		desc, n, err := pushBytes(ctx, repo, baseDescriptorName, descriptor)
		if err != nil {
			return nil, fmt.Errorf("pushing %s to %s: %w", baseDescriptorName, ref, err)
		}
		res.BytesPushed += n
		pack.Layers = append(pack.Layers, desc)
	}
	if d != nil {
		desc, n, skipped, err := pushWriteSet(ctx, repo, writeset.Path(imageDir, basestore.Entry(storeRoot, d.SHA256)), d)
		if err != nil {
			return nil, fmt.Errorf("pushing the write set of base %s to %s: %w", res.BaseDigest, ref, err)
		}
		res.WriteSetSkipped = skipped
		if desc != nil {
			res.WriteSetBytes = desc.Size
			res.BytesPushed += n
			pack.Layers = append(pack.Layers, *desc)
		}
	}
	files, err := checkpointFiles(imageDir)
	if err != nil {
		return nil, err
	}
	for _, name := range files {
		if name == baseDescriptorName {
			continue
		}
		desc, n, err := pushFile(ctx, repo, filepath.Join(imageDir, name))
		if err != nil {
			return nil, fmt.Errorf("pushing %s to %s: %w", name, ref, err)
		}
		res.BytesPushed += n
		pack.Layers = append(pack.Layers, desc)
	}
	res.Manifest, err = oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, CheckpointArtifactType, pack)
	if err != nil {
		return nil, fmt.Errorf("pushing the checkpoint manifest to %s: %w", ref, err)
	}
	if err := repo.Tag(ctx, res.Manifest, tag); err != nil {
		return nil, fmt.Errorf("tagging %s: %w", ref, err)
	}
	return res, nil
}

// pushBase pushes the base that d describes, block by block, then its block
// manifest and the base manifest, and records them in res.
func pushBase(ctx context.Context, repo *remote.Repository, imageDir, storeRoot, ref string, d *baseDescriptor, opts Options, res *PushResult) error {
	basePath := filepath.Join(imageDir, basestore.ImageName)
	if _, err := os.Stat(basePath); errors.Is(err, os.ErrNotExist) {
		if storeRoot == "" {
			return fmt.Errorf("%s has no %s and no base store was named", imageDir, basestore.ImageName)
		}
		basePath = filepath.Join(basestore.Entry(storeRoot, d.SHA256), basestore.ImageName)
	}
	base, err := os.Open(basePath)
	if err != nil {
		return fmt.Errorf("opening the base of %s: %w", imageDir, err)
	}
	defer base.Close()

	res.BaseDigest = "sha256:" + d.SHA256
	// Blocks are hashed in order and uploaded by fetchWorkers goroutines.
	var (
		layers []ocispec.Descriptor
		seen   = map[string]bool{}
		mu     sync.Mutex // guards res's counters
	)
	bar := newBar(opts.Progress, int64(d.Length), "pushing base")
	defer bar.Finish()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchWorkers)
	m, err := blockmanifest.Build(base, d.Length, func(i int, block []byte, sum [sha256.Size]byte) error {
		bar.Add(len(block))
		desc := ocispec.Descriptor{MediaType: BlockMediaType, Digest: digest.NewDigestFromBytes(digest.SHA256, sum[:]), Size: int64(len(block))}
		if seen[desc.Digest.String()] {
			return nil
		}
		seen[desc.Digest.String()] = true
		layers = append(layers, desc)
		data := bytes.Clone(block)
		g.Go(func() error {
			pushed, err := pushIfMissing(gctx, repo, desc, bytes.NewReader(data))
			if err != nil {
				return fmt.Errorf("pushing base block %d to %s: %w", i, ref, err)
			}
			if pushed {
				mu.Lock()
				res.BlocksPushed++
				res.BytesPushed += desc.Size
				mu.Unlock()
			}
			return nil
		})
		return gctx.Err()
	})
	if werr := g.Wait(); werr != nil {
		err = werr // the upload's error, not the cancellation it caused
	}
	if err != nil {
		return err
	}
	if m.Digest != res.BaseDigest {
		return fmt.Errorf("base %s hashes to %s, but the checkpoint in %s records %s: not pushed", basePath, m.Digest, imageDir, res.BaseDigest)
	}
	res.Blocks, res.ZeroBlocks = len(m.Blocks), m.ZeroBlocks()
	cfgData := m.Encode()
	cfg := content.NewDescriptorFromBytes(blockmanifest.MediaType, cfgData)
	if _, err := pushIfMissing(ctx, repo, cfg, bytes.NewReader(cfgData)); err != nil {
		return fmt.Errorf("pushing the block manifest to %s: %w", ref, err)
	}
	res.BaseManifest, err = oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, BaseArtifactType, oras.PackManifestOptions{
		ConfigDescriptor:    &cfg,
		Layers:              layers,
		ManifestAnnotations: map[string]string{BaseDigestAnnotation: res.BaseDigest, ocispec.AnnotationCreated: fixedCreated},
	})
	if err != nil {
		return fmt.Errorf("pushing the base manifest to %s: %w", ref, err)
	}
	// Registries keep what a tag names, and referrers of what they keep,
	// not the subjects of tagged manifests: tag the base itself, so that
	// garbage collection of untagged manifests keeps it.
	if err := repo.Tag(ctx, res.BaseManifest, BaseTag(d.SHA256)); err != nil {
		return fmt.Errorf("tagging the base manifest in %s: %w", ref, err)
	}
	return nil
}

// BaseTag is the tag Push gives the manifest of the base with hex digest
// hexDigest.
func BaseTag(hexDigest string) string { return "base-sha256-" + hexDigest }

// checkpointFiles returns the names of the files of imageDir that a pull
// must recreate: every regular file but the base, its learned write set
// (node-local) and hidden files.
func checkpointFiles(imageDir string) ([]string, error) {
	entries, err := os.ReadDir(imageDir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if name == basestore.ImageName || name == writeSetName || strings.HasPrefix(name, ".") {
			continue
		}
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("%s: %s is not a regular file; a checkpoint image directory holds files only", imageDir, name)
		}
		names = append(names, name)
	}
	return names, nil
}

// pushIfMissing pushes desc's content unless the registry has it, and says
// whether it pushed.
func pushIfMissing(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, r io.Reader) (bool, error) {
	ok, err := repo.Exists(ctx, desc)
	if err != nil {
		return false, err
	}
	if ok {
		return false, nil
	}
	return true, repo.Push(ctx, desc, r)
}

// pushBytes pushes data as the checkpoint file layer name; it returns its
// descriptor and the bytes uploaded.
func pushBytes(ctx context.Context, repo *remote.Repository, name string, data []byte) (ocispec.Descriptor, int64, error) {
	desc := content.NewDescriptorFromBytes(FileMediaType, data)
	desc.Annotations = map[string]string{ocispec.AnnotationTitle: name}
	pushed, err := pushIfMissing(ctx, repo, desc, bytes.NewReader(data))
	if err != nil || !pushed {
		return desc, 0, err
	}
	return desc, desc.Size, nil
}

// pushFile pushes the file at path as a checkpoint file layer; it returns
// its descriptor and the bytes uploaded.
func pushFile(ctx context.Context, repo *remote.Repository, path string) (ocispec.Descriptor, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return ocispec.Descriptor{}, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return ocispec.Descriptor{}, 0, err
	}
	desc := ocispec.Descriptor{
		MediaType:   FileMediaType,
		Digest:      digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil)),
		Size:        n,
		Annotations: map[string]string{ocispec.AnnotationTitle: filepath.Base(path)},
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return desc, 0, err
	}
	pushed, err := pushIfMissing(ctx, repo, desc, f)
	if err != nil || !pushed {
		return desc, 0, err
	}
	return desc, n, nil
}

// BaseStore is the node base store that Pull fills, through the `runsc
// bases` subcommand of the fork (which verifies what it stores).
type BaseStore struct {
	// Root is the store (runsc --base-store).
	Root string
	// Runsc is the fork's runsc binary.
	Runsc string
}

// Has reports whether the store holds the base with digest hexDigest.
func (s BaseStore) Has(hexDigest string) bool {
	_, err := os.Lstat(filepath.Join(basestore.Entry(s.Root, hexDigest), basestore.ImageName))
	return err == nil
}

// Import has runsc hash the file at path and store it as base hexDigest.
func (s BaseStore) Import(path, hexDigest string) error {
	out, err := exec.Command(s.Runsc, "--base-store="+s.Root, "bases", "import", "sha256:"+hexDigest, path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc bases import: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Link has runsc make the stored base hexDigest part of imageDir (a hard
// link and a recorded user), so that the store keeps it while the image
// exists.
func (s BaseStore) Link(imageDir, hexDigest string) error {
	out, err := exec.Command(s.Runsc, "--base-store="+s.Root, "bases", "link", "sha256:"+hexDigest, imageDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc bases link: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// PullResult says what Pull did.
type PullResult struct {
	// BaseDigest is the base digest, "sha256:<hex>".
	BaseDigest string
	// BaseWasStored is true if the node store held the base already (nothing
	// of it was fetched).
	BaseWasStored bool
	// BaseLazy is true if the base was registered with the node's lazy
	// fetcher (Options.Lazy) rather than fetched.
	BaseLazy bool
	// Blocks, ZeroBlocks, BlocksFetched: blocks of the base, those that are
	// all zeroes (never fetched) and those fetched (a block repeated in the
	// base is fetched once).
	Blocks, ZeroBlocks, BlocksFetched int
	// BytesFetched counts the block and file blobs fetched (not the
	// manifests and the block manifest config blob).
	BytesFetched int64
	// Files are the checkpoint files written.
	Files []string
	// WriteSet says what became of the base write set that the checkpoint
	// carried: "" if it carried none; "installed" if the node's restores
	// now apply it; "kept: ..." if the node had one (its own is kept);
	// "ignored: ..." or "not installed: ..." with the reason otherwise. A
	// write set only decides what restores copy eagerly, so none of these
	// fails the pull.
	WriteSet string
	// WriteSetBlocks says, for a lazy pull (Options.Lazy) that installed a
	// write set or found one, whether the non-zero blocks that the set
	// touches were read through the node's fetcher (fetched, or found
	// verified in its cache) before the pull returned
	// (lazybase.FetchWriteSetBlocks): "N blocks (B bytes) present", with
	// how many were left to the restores beyond
	// lazybase.MaxWriteSetBlocks, or "not fetched: ..." with the reason,
	// which does not fail the pull (a restore then fetches them itself).
	// "" otherwise.
	WriteSetBlocks string
}

// Pull fetches the checkpoint ref into imageDir, which must not exist, and
// its base into the node store unless the store holds it; then it links the
// base into imageDir. When the store holds the base already, the registry
// must still show it holds every block of it (so that a checkpoint cannot
// claim a base its registry does not have). On error, imageDir is not
// created; a base already verified and stored stays stored (content
// addressed: `runsc bases gc` removes it when no image uses it).
func Pull(ctx context.Context, ref, imageDir string, store BaseStore, opts Options) (_ *PullResult, err error) {
	defer explain(&err, ref)
	if store.Root == "" {
		return nil, errors.New("pull needs a node base store (--base-store)")
	}
	if _, err := os.Lstat(imageDir); err == nil {
		return nil, fmt.Errorf("%s exists; pull writes a new image directory", imageDir)
	}
	repo, err := Repository(ref, opts)
	if err != nil {
		return nil, err
	}
	// One round trip: resolve and fetch the manifest together.
	desc, rc, err := repo.FetchReference(ctx, repo.Reference.Reference)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", ref, err)
	}
	var man ocispec.Manifest
	err = decodeManifest(rc, desc, &man)
	rc.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: checkpoint manifest: %w", ref, err)
	}
	if man.ArtifactType != CheckpointArtifactType {
		return nil, fmt.Errorf("%s is not a forkvisor checkpoint (artifact type %q, want %q)", ref, man.ArtifactType, CheckpointArtifactType)
	}
	res := &PullResult{BaseDigest: man.Annotations[BaseDigestAnnotation]}
	var total int64
	names := map[string]bool{}
	var writeSet *ocispec.Descriptor
	files := make([]ocispec.Descriptor, 0, len(man.Layers))
	for i, l := range man.Layers {
		name := l.Annotations[ocispec.AnnotationTitle]
		if l.MediaType == WriteSetMediaType {
			switch {
			case writeSet != nil:
				res.WriteSet = "ignored: the checkpoint has more than one write set layer"
				writeSet = nil
			case res.WriteSet != "":
			case l.Size <= 0 || l.Size > writeset.MaxBytes:
				res.WriteSet = fmt.Sprintf("ignored: the write set layer declares %d bytes, want 1 to %d", l.Size, writeset.MaxBytes)
			default:
				writeSet = &man.Layers[i]
			}
			continue
		}
		if l.MediaType != FileMediaType || name == "" || name != filepath.Base(name) || name == "." || name == ".." || strings.HasPrefix(name, ".") || name == basestore.ImageName || name == writeSetName || names[name] || l.Size < 0 {
			return nil, fmt.Errorf("%s: checkpoint layer %s (%q, media type %q) is not a checkpoint file", ref, l.Digest, name, l.MediaType)
		}
		names[name] = true
		total += l.Size
		files = append(files, l)
	}

	parent := filepath.Dir(filepath.Clean(imageDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	if err := checkSpace(parent, total); err != nil {
		return nil, fmt.Errorf("%s: checkpoint files: %w", ref, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(imageDir)+".pull-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	defer os.RemoveAll(tmp)
	// The files, the write set and the base manifest are fetched at once:
	// each is a registry round trip, and none depends on another.
	var (
		fetched      atomic.Int64
		writeSetData []byte
		baseMan      *ocispec.Manifest
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchWorkers)
	for _, l := range files {
		name := l.Annotations[ocispec.AnnotationTitle]
		res.Files = append(res.Files, name)
		g.Go(func() error {
			n, err := fetchToFile(gctx, repo, l, filepath.Join(tmp, name))
			if err != nil {
				return fmt.Errorf("%s: fetching %s (%s): %w", ref, name, l.Digest, err)
			}
			fetched.Add(n)
			return nil
		})
	}
	if writeSet != nil {
		g.Go(func() error {
			data, err := fetchBytes(gctx, repo, *writeSet, writeset.MaxBytes)
			if err != nil {
				// Only a hint: the pull goes on without it.
				res.WriteSet = fmt.Sprintf("ignored: fetching it (%s): %v", writeSet.Digest, err)
				return nil
			}
			writeSetData = data
			fetched.Add(int64(len(data)))
			return nil
		})
	}
	if man.Subject != nil {
		g.Go(func() (err error) {
			baseMan, err = fetchBaseManifest(gctx, repo, ref, *man.Subject)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.BytesFetched += fetched.Load()
	d, _, err := readBaseDescriptor(filepath.Join(tmp, baseDescriptorName))
	var m *blockmanifest.Manifest // the base's block manifest, if it has a base
	switch {
	case errors.Is(err, os.ErrNotExist) && man.Subject == nil && res.BaseDigest == "":
		d = nil // A checkpoint without a shared base.
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: the manifest names a base (%q) but the checkpoint has no %s", ref, res.BaseDigest, baseDescriptorName)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", ref, err)
	case man.Subject == nil || res.BaseDigest != "sha256:"+d.SHA256:
		return nil, fmt.Errorf("%s: the checkpoint's %s needs base sha256:%s, the manifest names %q", ref, baseDescriptorName, d.SHA256, res.BaseDigest)
	default:
		var layers []ocispec.Descriptor
		m, layers, err = fetchBlockManifest(ctx, repo, ref, *man.Subject, baseMan, d)
		if err != nil {
			return nil, err
		}
		res.Blocks, res.ZeroBlocks = len(m.Blocks), m.ZeroBlocks()
		if store.Has(d.SHA256) {
			if err := checkBlocksExist(ctx, repo, ref, layers); err != nil {
				return nil, err
			}
			res.BaseWasStored = true
		} else if opts.Lazy {
			src := lazybase.Source{Reference: repo.Reference.Registry + "/" + repo.Reference.Repository, PlainHTTP: opts.PlainHTTP}
			if err := lazybase.Register(store.Root, m, src); err != nil {
				return nil, fmt.Errorf("%s: %w", ref, err)
			}
			res.BaseLazy = true
		} else if err := pullBase(ctx, repo, ref, m, d, store, opts, res); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, imageDir, unix.RENAME_NOREPLACE); err != nil {
		return nil, fmt.Errorf("%s: moving the pulled image into %s: %w", ref, imageDir, err)
	}
	if d != nil && !res.BaseLazy {
		if err := store.Link(imageDir, d.SHA256); err != nil {
			os.RemoveAll(imageDir)
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
	}
	served := false
	if writeSetData != nil {
		res.WriteSet, served = installWriteSet(store, d, res.BaseLazy, writeSetData)
	}
	if res.BaseLazy && served {
		// Every restore copies these pages first: fetch them now rather
		// than while a restore starts its sandbox.
		res.WriteSetBlocks = fetchWriteSetBlocks(ctx, store.Root, m)
	}
	return res, nil
}

// installWriteSet makes data, a write set that came with a checkpoint of
// base d, the one that the node's restores of d apply, unless the node has
// a write set file for d already (its own, one being learned, or one an
// earlier pull installed), which is kept; it returns what it did
// (PullResult.WriteSet), and whether the node has a write set file for d
// now (installed or kept). A write set is
// a hint (which pages a restore copies eagerly): every failure here is
// reported, and loses nothing that the pull promised.
func installWriteSet(store BaseStore, d *baseDescriptor, lazy bool, data []byte) (string, bool) {
	if d == nil {
		return "ignored: the checkpoint has no shared base", false
	}
	if err := writeset.Check(data, d.Length, d.id()); err != nil {
		return "ignored: " + err.Error(), false
	}
	var (
		installed bool
		err       error
	)
	if lazy {
		installed, err = lazybase.AddWriteSet(store.Root, d.SHA256, data)
	} else {
		// runsc keeps its own in the store entry, and may be learning
		// into it right now: an existing file is never replaced.
		installed, err = noreplace.WriteFile(filepath.Join(basestore.Entry(store.Root, d.SHA256), writeSetName), data, 0o444)
	}
	switch {
	case err != nil:
		return "not installed: " + err.Error(), false
	case installed:
		return "installed", true
	default:
		return "kept: the node has one for this base", true
	}
}

// fetchWriteSetBlocks has the node's lazy fetcher fetch the blocks of the
// write set it serves for the base with block manifest m
// (lazybase.FetchWriteSetBlocks) and returns what it did
// (PullResult.WriteSetBlocks).
func fetchWriteSetBlocks(ctx context.Context, root string, m *blockmanifest.Manifest) string {
	got, err := lazybase.FetchWriteSetBlocks(ctx, root, m)
	switch {
	case err != nil:
		return "not fetched: " + err.Error()
	case got.Left > 0:
		return fmt.Sprintf("%d blocks (%d bytes) present, %d more left to the restores (at most %d blocks here)", got.Read, got.Bytes, got.Left, lazybase.MaxWriteSetBlocks)
	default:
		return fmt.Sprintf("%d blocks (%d bytes) present", got.Read, got.Bytes)
	}
}

// BlockFetcher returns the lazybase.FetchFunc that fetches base blocks from
// src's repository, with credentials from the Docker configuration file.
// It does not hash what it fetches: lazybase compares every block's size
// and SHA-256 with the block manifest before using it, and a second hash
// here would only cost a lazy node CPU while its sandboxes start.
func BlockFetcher(src lazybase.Source) (lazybase.FetchFunc, error) {
	repo, err := Repository(src.Reference, Options{PlainHTTP: src.PlainHTTP})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, dg string, size int64) ([]byte, error) {
		rc, err := repo.Fetch(ctx, ocispec.Descriptor{MediaType: BlockMediaType, Digest: digest.Digest(dg), Size: size})
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		// At most one byte more than the block, so that a longer blob
		// fails the caller's size check instead of passing truncated. A
		// body cut short by the transport is an error of its own
		// (io.ErrUnexpectedEOF), not a block that does not match.
		buf := bytes.NewBuffer(make([]byte, 0, size+1))
		_, err = buf.ReadFrom(io.LimitReader(rc, size+1))
		return buf.Bytes(), err
	}, nil
}

// fetchBlockManifest checks man, the base manifest subject, fetches its
// block manifest, and checks both against d; it returns the block manifest
// and the manifest's block layers.
func fetchBlockManifest(ctx context.Context, repo *remote.Repository, ref string, subject ocispec.Descriptor, man *ocispec.Manifest, d *baseDescriptor) (*blockmanifest.Manifest, []ocispec.Descriptor, error) {
	if man.ArtifactType != BaseArtifactType || man.Config.MediaType != blockmanifest.MediaType {
		return nil, nil, fmt.Errorf("%s: base manifest %s is not a forkvisor base (artifact type %q, config %q)", ref, subject.Digest, man.ArtifactType, man.Config.MediaType)
	}
	// 80 bytes per block entry is more than `"sha256:<64 hex>",` needs.
	maxConfig := int64(256 + 80*((d.Length-1)/blockmanifest.BlockSize+1))
	cfgData, err := fetchBytes(ctx, repo, man.Config, maxConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: block manifest %s: %w", ref, man.Config.Digest, err)
	}
	m, err := blockmanifest.Decode(cfgData)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", ref, err)
	}
	if m.Digest != "sha256:"+d.SHA256 || m.Length != d.Length {
		return nil, nil, fmt.Errorf("%s: block manifest is for base %s (%d bytes), the checkpoint needs sha256:%s (%d bytes)", ref, m.Digest, m.Length, d.SHA256, d.Length)
	}
	// The layers must be exactly the distinct non-zero blocks.
	want := map[string]bool{}
	for i, b := range m.Blocks {
		if !m.Zero(i) {
			want[b] = true
		}
	}
	for _, l := range man.Layers {
		if l.MediaType != BlockMediaType || !want[l.Digest.String()] {
			return nil, nil, fmt.Errorf("%s: base manifest %s lists layer %s (%q), which is not a block of the base", ref, subject.Digest, l.Digest, l.MediaType)
		}
		delete(want, l.Digest.String())
	}
	if len(want) != 0 {
		return nil, nil, fmt.Errorf("%s: base manifest %s lacks %d block(s) of the base", ref, subject.Digest, len(want))
	}
	return m, man.Layers, nil
}

// checkBlocksExist checks that the repository holds every block layer.
func checkBlocksExist(ctx context.Context, repo *remote.Repository, ref string, layers []ocispec.Descriptor) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchWorkers)
	for _, l := range layers {
		g.Go(func() error {
			ok, err := repo.Exists(gctx, l)
			if err != nil {
				return fmt.Errorf("%s: base block %s: %w", ref, l.Digest, err)
			}
			if !ok {
				return fmt.Errorf("%s: the registry lacks base block %s", ref, l.Digest)
			}
			return nil
		})
	}
	return g.Wait()
}

// pullBase fetches every distinct non-zero block of m, verified, into a file
// in the store's directory, and has the store import it.
func pullBase(ctx context.Context, repo *remote.Repository, ref string, m *blockmanifest.Manifest, d *baseDescriptor, store BaseStore, opts Options, res *PullResult) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s: storing base sha256:%s needs root (a stored base is owned by root)", ref, d.SHA256)
	}
	// Blocks by digest: each distinct block is fetched once, then written
	// wherever the base repeats it.
	where := map[string][]int{}
	var order []string
	for i, b := range m.Blocks {
		if m.Zero(i) {
			continue
		}
		if where[b] == nil {
			order = append(order, b)
		}
		where[b] = append(where[b], i)
	}
	var total int64
	for _, b := range order {
		for _, i := range where[b] {
			_, n := m.Range(i)
			total += int64(n)
		}
	}
	if err := os.MkdirAll(store.Root, 0o711); err != nil {
		return err
	}
	if err := checkSpace(store.Root, total); err != nil {
		return fmt.Errorf("%s: base sha256:%s: %w", ref, d.SHA256, err)
	}
	// The store's convention for importers: a ".pull-" directory in its
	// root, held under flock while it is filled, so that `runsc bases gc`
	// removes it only once its puller is gone.
	dir, err := os.MkdirTemp(store.Root, ".pull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lock, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(lock)
	if err := unix.Flock(lock, unix.LOCK_EX); err != nil {
		return err
	}
	path := filepath.Join(dir, basestore.ImageName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(int64(m.Length)); err != nil {
		return err
	}

	bar := newBar(opts.Progress, total, "fetching base")
	defer bar.Finish()
	var fetched atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchWorkers)
	for _, b := range order {
		idx := where[b]
		g.Go(func() error {
			_, n := m.Range(idx[0])
			desc := ocispec.Descriptor{MediaType: BlockMediaType, Digest: digest.Digest(b), Size: int64(n)}
			block, err := content.FetchAll(gctx, repo, desc)
			if err != nil {
				return fmt.Errorf("%s: base block %d (%s): %w", ref, idx[0], b, err)
			}
			for _, i := range idx {
				off, _ := m.Range(i)
				if _, err := f.WriteAt(block, int64(off)); err != nil {
					return fmt.Errorf("writing base block %d to %s: %w", i, path, err)
				}
				bar.Add(len(block))
			}
			fetched.Add(int64(len(block)))
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	res.BlocksFetched = len(order)
	res.BytesFetched += fetched.Load()
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Chmod(0o444); err != nil {
		return err
	}
	// The store takes only a file that nobody can write any more.
	if err := f.Close(); err != nil {
		return err
	}
	if err := store.Import(path, d.SHA256); err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	return nil
}

// checkSpace returns an error if the filesystem of dir has less than need
// bytes available.
func checkSpace(dir string, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if avail := int64(st.Bavail) * st.Bsize; need > avail {
		return fmt.Errorf("needs %d bytes, %s has %d available", need, dir, avail)
	}
	return nil
}

// explain adds to *err what a user can do about it, where that is known.
func explain(err *error, ref string) {
	if *err != nil && errors.Is(*err, auth.ErrBasicCredentialNotFound) {
		host, _, _ := strings.Cut(ref, "/")
		*err = fmt.Errorf("%w (no credentials for %s in the Docker configuration: $DOCKER_CONFIG/config.json or ~/.docker/config.json)", *err, host)
	}
}

// fetchBaseManifest fetches the base manifest subject (which
// fetchBlockManifest checks).
func fetchBaseManifest(ctx context.Context, repo *remote.Repository, ref string, subject ocispec.Descriptor) (*ocispec.Manifest, error) {
	var man ocispec.Manifest
	if err := fetchJSON(ctx, repo, subject, maxManifestBytes, &man); err != nil {
		return nil, fmt.Errorf("%s: base manifest %s: %w", ref, subject.Digest, err)
	}
	return &man, nil
}

// decodeManifest reads the manifest desc from rc, verified against desc and
// refused before reading if it declares more than maxManifestBytes, and
// decodes it into v.
func decodeManifest(rc io.Reader, desc ocispec.Descriptor, v any) error {
	if desc.Size < 0 || desc.Size > maxManifestBytes {
		return fmt.Errorf("it declares %d bytes, more than the %d accepted", desc.Size, maxManifestBytes)
	}
	data, err := content.ReadAll(rc, desc)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// fetchBytes fetches desc, verified, refusing a descriptor that declares
// more than max bytes before fetching anything.
func fetchBytes(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, max int64) ([]byte, error) {
	if desc.Size < 0 || desc.Size > max {
		return nil, fmt.Errorf("it declares %d bytes, more than the %d accepted", desc.Size, max)
	}
	return content.FetchAll(ctx, repo, desc)
}

// fetchJSON fetches desc (at most max bytes), verified, and decodes it into
// v.
func fetchJSON(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, max int64, v any) error {
	data, err := fetchBytes(ctx, repo, desc, max)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// fetchToFile fetches desc into a new file at path, verifying its digest
// and size, and returns the bytes written.
func fetchToFile(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, path string) (int64, error) {
	rc, err := repo.Fetch(ctx, desc)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	vr := content.NewVerifyReader(rc, desc)
	n, err := io.Copy(f, vr)
	if err != nil {
		return n, err
	}
	if err := vr.Verify(); err != nil {
		return n, err
	}
	return n, f.Sync()
}

// bar is a progress bar that may be off.
type bar struct {
	mu sync.Mutex
	pb *progressbar.ProgressBar
}

func newBar(w io.Writer, total int64, what string) *bar {
	if w == nil {
		return &bar{}
	}
	return &bar{pb: progressbar.NewOptions64(total, progressbar.OptionSetWriter(w), progressbar.OptionShowBytes(true),
		progressbar.OptionSetDescription(what), progressbar.OptionClearOnFinish())}
}

func (b *bar) Add(n int) {
	if b.pb == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pb.Add(n)
}

func (b *bar) Finish() {
	if b.pb != nil {
		b.pb.Finish()
	}
}
