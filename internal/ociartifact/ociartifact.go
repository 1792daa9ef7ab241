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
//     reference (tag) names this manifest.
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

	"github.com/forkvisor/forkvisor/internal/blockmanifest"
)

// Artifact and media types, and annotations.
const (
	BaseArtifactType       = "application/vnd.forkvisor.base.v1"
	BlockMediaType         = "application/vnd.forkvisor.base.block.v1"
	CheckpointArtifactType = "application/vnd.forkvisor.checkpoint.v1"
	FileMediaType          = "application/vnd.forkvisor.checkpoint.file.v1"
	// BaseDigestAnnotation holds the base digest ("sha256:<hex>") on both
	// manifests.
	BaseDigestAnnotation = "dev.forkvisor.base.digest"
)

// Names in a checkpoint image directory (runsc/sharedbase in the fork).
const (
	baseImageName      = "base.img"
	baseDescriptorName = "base.json"
	writeSetName       = "base.writeset"
)

// fixedCreated makes manifests reproducible: the same content gives the same
// manifest digest.
const fixedCreated = "1970-01-01T00:00:00Z"

// fetchWorkers is the number of blobs fetched or pushed at once.
const fetchWorkers = 4

// Options are the options of Push and Pull.
type Options struct {
	// PlainHTTP talks HTTP instead of HTTPS (a registry on loopback).
	PlainHTTP bool
	// Progress, if not nil, receives a progress bar for base blocks (pass a
	// terminal; nil is quiet).
	Progress io.Writer
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

func readBaseDescriptor(path string) (*baseDescriptor, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d baseDescriptor
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if d.Version != 1 {
		return nil, fmt.Errorf("%s: version %d, want 1", path, d.Version)
	}
	if id, err := hex.DecodeString(d.SHA256); err != nil || len(id) != sha256.Size {
		return nil, fmt.Errorf("%s: sha256 %q is not a digest", path, d.SHA256)
	}
	if d.Length == 0 {
		return nil, fmt.Errorf("%s: empty base", path)
	}
	return &d, nil
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
	// BytesPushed counts every blob uploaded.
	BytesPushed int64
}

// Push pushes the checkpoint in imageDir to ref. A checkpoint saved with
// --shared-base is pushed as two artifacts (see the package comment): its
// base is imageDir/base.img or, without it, the base with the checkpoint's
// digest in the node base store at storeRoot, and it is hashed as it is
// pushed; nothing is tagged unless it hashes to the digest the checkpoint
// records. Any other checkpoint is pushed as one artifact of its files.
func Push(ctx context.Context, imageDir, storeRoot, ref string, opts Options) (_ *PushResult, err error) {
	defer explain(&err, ref)
	d, err := readBaseDescriptor(filepath.Join(imageDir, baseDescriptorName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	repo, err := Repository(ref, opts)
	if err != nil {
		return nil, err
	}
	tag := repo.Reference.Reference
	if tag == "" {
		return nil, fmt.Errorf("reference %q has no tag", ref)
	}
	res := &PushResult{}
	pack := oras.PackManifestOptions{ManifestAnnotations: map[string]string{ocispec.AnnotationCreated: fixedCreated}}
	if d != nil {
		if err := pushBase(ctx, repo, imageDir, storeRoot, ref, d, opts, res); err != nil {
			return nil, err
		}
		pack.Subject = &res.BaseManifest
		pack.ManifestAnnotations[BaseDigestAnnotation] = res.BaseDigest
	}
	files, err := checkpointFiles(imageDir)
	if err != nil {
		return nil, err
	}
	for _, name := range files {
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
	basePath := filepath.Join(imageDir, baseImageName)
	if _, err := os.Stat(basePath); errors.Is(err, os.ErrNotExist) {
		basePath = filepath.Join(storeRoot, "sha256", d.SHA256, baseImageName)
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
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchWorkers)
	m, err := blockmanifest.Build(base, d.Length, func(i int, block []byte) error {
		bar.Add(len(block))
		sum := sha256.Sum256(block)
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
	bar.Finish()
	if err != nil {
		return err
	}
	if m.Digest != res.BaseDigest {
		return fmt.Errorf("base %s hashes to %s, but the checkpoint in %s records %s: not pushed", basePath, m.Digest, imageDir, res.BaseDigest)
	}
	res.Blocks = len(m.Blocks)
	for i := range m.Blocks {
		if m.Zero(i) {
			res.ZeroBlocks++
		}
	}
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
	return nil
}

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
		if name == baseImageName || name == writeSetName || strings.HasPrefix(name, ".") {
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
	_, err := os.Lstat(filepath.Join(s.Root, "sha256", hexDigest, baseImageName))
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

// PullResult says what Pull did.
type PullResult struct {
	// BaseDigest is the base digest, "sha256:<hex>".
	BaseDigest string
	// BaseWasStored is true if the node store held the base already (nothing
	// of it was fetched).
	BaseWasStored bool
	// Blocks, ZeroBlocks, BlocksFetched: blocks of the base, those that are
	// all zeroes (never fetched) and those fetched (a block repeated in the
	// base is fetched once).
	Blocks, ZeroBlocks, BlocksFetched int
	// BytesFetched counts every blob fetched.
	BytesFetched int64
	// Files are the checkpoint files written.
	Files []string
}

// Pull fetches the checkpoint ref into imageDir, which must not exist, and
// its base into the node store unless the store holds it. On error, imageDir
// is not created and the store is left as it was.
func Pull(ctx context.Context, ref, imageDir string, store BaseStore, opts Options) (_ *PullResult, err error) {
	defer explain(&err, ref)
	if _, err := os.Lstat(imageDir); err == nil {
		return nil, fmt.Errorf("%s exists; pull writes a new image directory", imageDir)
	}
	repo, err := Repository(ref, opts)
	if err != nil {
		return nil, err
	}
	desc, err := repo.Resolve(ctx, repo.Reference.Reference)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", ref, err)
	}
	var man ocispec.Manifest
	if err := fetchJSON(ctx, repo, desc, &man); err != nil {
		return nil, fmt.Errorf("%s: checkpoint manifest: %w", ref, err)
	}
	if man.ArtifactType != CheckpointArtifactType {
		return nil, fmt.Errorf("%s is not a forkvisor checkpoint (artifact type %q, want %q)", ref, man.ArtifactType, CheckpointArtifactType)
	}
	res := &PullResult{BaseDigest: man.Annotations[BaseDigestAnnotation]}

	parent := filepath.Dir(filepath.Clean(imageDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(imageDir)+".pull-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, l := range man.Layers {
		name := l.Annotations[ocispec.AnnotationTitle]
		if l.MediaType != FileMediaType || name == "" || name != filepath.Base(name) || name == "." || name == ".." || strings.HasPrefix(name, ".") || name == baseImageName {
			return nil, fmt.Errorf("%s: checkpoint layer %s (%q, media type %q) is not a checkpoint file", ref, l.Digest, name, l.MediaType)
		}
		n, err := fetchToFile(ctx, repo, l, filepath.Join(tmp, name))
		if err != nil {
			return nil, fmt.Errorf("%s: fetching %s (%s): %w", ref, name, l.Digest, err)
		}
		res.BytesFetched += n
		res.Files = append(res.Files, name)
	}
	d, err := readBaseDescriptor(filepath.Join(tmp, baseDescriptorName))
	switch {
	case errors.Is(err, os.ErrNotExist) && man.Subject == nil && res.BaseDigest == "":
		// A checkpoint without a shared base.
	case err != nil:
		return nil, fmt.Errorf("%s: %w", ref, err)
	case man.Subject == nil || res.BaseDigest != "sha256:"+d.SHA256:
		return nil, fmt.Errorf("%s: the checkpoint's base.json needs base sha256:%s, the manifest names %q", ref, d.SHA256, res.BaseDigest)
	case store.Has(d.SHA256):
		res.BaseWasStored = true
	default:
		if err := pullBase(ctx, repo, ref, *man.Subject, d, store, opts, res); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, imageDir); err != nil {
		return nil, err
	}
	return res, nil
}

// pullBase fetches the base manifest subject, checks it against d, fetches
// every distinct non-zero block, verified, into a file in the store's
// directory, and has the store import it.
func pullBase(ctx context.Context, repo *remote.Repository, ref string, subject ocispec.Descriptor, d *baseDescriptor, store BaseStore, opts Options, res *PullResult) error {
	var man ocispec.Manifest
	if err := fetchJSON(ctx, repo, subject, &man); err != nil {
		return fmt.Errorf("%s: base manifest %s: %w", ref, subject.Digest, err)
	}
	if man.ArtifactType != BaseArtifactType || man.Config.MediaType != blockmanifest.MediaType {
		return fmt.Errorf("%s: base manifest %s is not a forkvisor base (artifact type %q, config %q)", ref, subject.Digest, man.ArtifactType, man.Config.MediaType)
	}
	cfgData, err := content.FetchAll(ctx, repo, man.Config)
	if err != nil {
		return fmt.Errorf("%s: block manifest %s: %w", ref, man.Config.Digest, err)
	}
	res.BytesFetched += int64(len(cfgData))
	m, err := blockmanifest.Decode(cfgData)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	if m.Digest != "sha256:"+d.SHA256 || m.Length != d.Length {
		return fmt.Errorf("%s: block manifest is for base %s (%d bytes), the checkpoint needs sha256:%s (%d bytes)", ref, m.Digest, m.Length, d.SHA256, d.Length)
	}
	res.Blocks = len(m.Blocks)

	if err := os.MkdirAll(store.Root, 0o711); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(store.Root, ".pull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, baseImageName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(int64(m.Length)); err != nil {
		return err
	}

	// Blocks by digest: each distinct block is fetched once, then written
	// wherever the base repeats it.
	where := map[string][]int{}
	var order []string
	for i, b := range m.Blocks {
		if m.Zero(i) {
			res.ZeroBlocks++
			continue
		}
		if where[b] == nil {
			order = append(order, b)
		}
		where[b] = append(where[b], i)
	}
	var total int64
	for _, b := range order {
		_, n := m.Range(where[b][0])
		total += int64(n)
	}
	bar := newBar(opts.Progress, total, "fetching base")
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
			}
			fetched.Add(int64(len(block)))
			bar.Add(len(block))
			return nil
		})
	}
	err = g.Wait()
	bar.Finish()
	if err != nil {
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
	if err := unix.Fchown(int(f.Fd()), 0, 0); err != nil {
		return fmt.Errorf("a stored base must be owned by root: %w", err)
	}
	return store.Import(path, d.SHA256)
}

// explain adds to *err what a user can do about it, where that is known.
func explain(err *error, ref string) {
	if *err != nil && errors.Is(*err, auth.ErrBasicCredentialNotFound) {
		host, _, _ := strings.Cut(ref, "/")
		*err = fmt.Errorf("%w (no credentials for %s in the Docker configuration: $DOCKER_CONFIG/config.json or ~/.docker/config.json)", *err, host)
	}
}

// fetchJSON fetches desc, verified, and decodes it into v.
func fetchJSON(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, v any) error {
	data, err := content.FetchAll(ctx, repo, desc)
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
