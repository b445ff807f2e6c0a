package kubernetes

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/imagetar"
	"github.com/stockade-sh/stockade/internal/registry"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// How a pod refers to its image (docs/kubernetes.md, "Images in the
// cluster", tells the operator). Each runtime image, with the guest agent
// at profile.GuestPath, is an OCI image of one uncompressed layer (what
// writeTree writes) whose bytes depend on the image's files as they lie
// in the data directory (contents, modes, owners, mtimes, hard links) and
// on the guest. Its name, though, depends only on the image store's
// recorded digest of the image and on the guest's digest (imageTag), not
// on how the files lie: a copy of the data directory whose owners or
// mtimes differ (filled by a non-root pod) names the same image. Two ways
// bring it to the nodes:
//
//   - without a registry (Config.Registry empty), ImageRef names it as a
//     tag in the registry domain stockade.invalid, which no name server
//     resolves: the image is imported on each node (`ctr -n k8s.io images
//     import` of what WriteImageArchive writes) and the kubelet never
//     pulls it (imagePullPolicy Never);
//   - with a registry, `stockade image push REGISTRY` puts it there
//     (NewOCIImage) under that tag, REGISTRY/<name>:<imageTag>; the driver
//     asks the registry once per image which manifest the tag names
//     (registry.Client.Resolve: one HEAD) and pods name the image by that
//     digest, REGISTRY/<name>@sha256:<digest>, pulled IfNotPresent. The
//     driver never hashes the layer itself.

// ImageDomain is the registry domain of the images ImageRef names.
const ImageDomain = "stockade.invalid"

// archiveFormat names how WriteImageArchive builds the layer; it changes
// whenever its output does, so that no node keeps an image of an older
// driver under the same name.
const archiveFormat = "k3"

var sha256ID = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ImageRef is the name of img with the guest whose sha256 is guestHex, as
// an image imported on the node:
// stockade.invalid/<runtime>:<image digest[:12]>-<guest digest[:12]>-<archiveFormat>.
// Both digests are in the tag, so a rebuilt image or a new guest gets a
// new name and never reuses a stale one.
func ImageRef(img sandbox.Image, guestHex string) (string, error) {
	if !sha256ID.MatchString(img.Digest) {
		return "", fmt.Errorf("image %q has digest %q, not sha256:<hex>: %w", img.Name, img.Digest, errdefs.ErrInvalidArgument)
	}
	if len(guestHex) < 12 {
		return "", fmt.Errorf("guest digest %q is too short: %w", guestHex, errdefs.ErrInvalidArgument)
	}
	name := img.Name
	if registry.ValidName(name) != nil {
		name = "image"
	}
	return ImageDomain + "/" + name + ":" + imageTag(img, guestHex), nil
}

// imageTag is ImageRef's tag of img with the guest whose sha256 is
// guestHex, which ImageRef has checked: the tag `image push` puts in a
// registry too, from which the driver resolves the pushed digest.
func imageTag(img sandbox.Image, guestHex string) string {
	return img.Digest[len("sha256:"):][:12] + "-" + guestHex[:12] + "-" + archiveFormat
}

// imageRef is the image of img's pods and its pull policy.
func (d *Driver) imageRef(ctx context.Context, img sandbox.Image) (string, corev1.PullPolicy, error) {
	if d.cfg.ImageRef != nil {
		return d.cfg.ImageRef(img)
	}
	sum, err := d.guest.hex(d.cfg.GuestPath)
	if err != nil {
		return "", "", err
	}
	if d.registry != nil {
		if err := registry.ValidName(img.Name); err != nil {
			// A template the operator named so: no client mends it.
			return "", "", fmt.Errorf("kubernetes: image %q cannot be in a registry: %w", img.Name, errdefs.Publicf("image %q cannot be pulled from kubernetes.registry: its name is not a repository name: %w", img.Name, errdefs.ErrFailedPrecondition))
		}
		if _, err := ImageRef(img, sum); err != nil {
			return "", "", err
		}
		digest, err := d.digests.resolve(ctx, img.Name, imageTag(img, sum))
		if err != nil {
			return "", "", err
		}
		return d.registry.Ref(img.Name, digest), corev1.PullIfNotPresent, nil
	}
	ref, err := ImageRef(img, sum)
	return ref, corev1.PullNever, err
}

// OCIImage is a runtime image with the guest as an OCI image of one
// layer: what `stockade image push` puts in a registry and the driver
// names by Digest.
type OCIImage struct {
	// Name is the repository's last component: the runtime's or the
	// template's name.
	Name string
	// Tag is ImageRef's tag, from the image's and the guest's digests:
	// the driver resolves it in the registry to Digest.
	Tag string
	// Config and Layer are the image's blobs; Layer.Write writes the
	// layer (again: NewOCIImage hashed it once).
	Config, Layer registry.Blob
	// Manifest is the image manifest; Digest its sha256.
	Manifest []byte
	Digest   string
}

// Blobs are the image's blobs, the layer first.
func (o OCIImage) Blobs() []registry.Blob { return []registry.Blob{o.Layer, o.Config} }

// NewOCIImage returns img with the guest at guestPath as an OCI image,
// reading (and hashing) its whole layer once: seconds for a large image.
func NewOCIImage(img sandbox.Image, guestPath string) (OCIImage, error) {
	if !filepath.IsAbs(img.Rootfs) {
		return OCIImage{}, fmt.Errorf("image rootfs %q is not an absolute path: %w", img.Rootfs, errdefs.ErrInvalidArgument)
	}
	if err := registry.ValidName(img.Name); err != nil {
		return OCIImage{}, err
	}
	sum, err := GuestDigest(guestPath)
	if err != nil {
		return OCIImage{}, err
	}
	if _, err := ImageRef(img, sum); err != nil {
		return OCIImage{}, err
	}
	// The layer's size is what io.Copy counts.
	h := sha256.New()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTree(pw, img.Rootfs, guestPath)) }()
	size, err := io.Copy(h, pr)
	pr.Close()
	if err != nil {
		return OCIImage{}, err
	}
	layerDigest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	config, err := imageConfig(layerDigest)
	if err != nil {
		return OCIImage{}, err
	}
	cs := sha256.Sum256(config)
	o := OCIImage{
		Name:   img.Name,
		Tag:    imageTag(img, sum),
		Config: registry.Blob{Digest: "sha256:" + hex.EncodeToString(cs[:]), Size: int64(len(config)), Write: func(w io.Writer) error { _, err := w.Write(config); return err }},
		Layer: registry.Blob{Digest: layerDigest, Size: size, Write: func(w io.Writer) error {
			return writeTree(w, img.Rootfs, guestPath)
		}},
	}
	o.Manifest, err = json.Marshal(registry.Manifest{
		SchemaVersion: 2, MediaType: registry.MediaTypeManifest,
		Config: registry.Descriptor{MediaType: registry.MediaTypeConfig, Digest: o.Config.Digest, Size: o.Config.Size},
		Layers: []registry.Descriptor{{MediaType: registry.MediaTypeLayer, Digest: o.Layer.Digest, Size: o.Layer.Size}},
	})
	if err != nil {
		return OCIImage{}, err
	}
	ms := sha256.Sum256(o.Manifest)
	o.Digest = "sha256:" + hex.EncodeToString(ms[:])
	return o, nil
}

// imageConfig is the OCI image configuration of the image whose one
// layer's digest (uncompressed: its diff ID too) is layerDigest. Its JSON
// has sorted keys and no dates, so the same layer gives the same bytes.
func imageConfig(layerDigest string) ([]byte, error) {
	return json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"User": fmt.Sprintf("%d:%d", profile.Default().User.UID, profile.Default().User.GID)},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
}

// digestCache holds the manifest digests the registry's tags named
// (registry.Client.Resolve), by repository and tag, so that each image is
// asked for once per daemon. A tag names one image and one guest, so the
// map holds one entry per image the daemon ran and guest it had: few.
// Failures are not kept: a later Create asks again.
type digestCache struct {
	client *registry.Client
	mu     sync.Mutex
	m      map[string]string
}

// resolve returns the digest that the registry's tag of the image name
// names. A tag the registry lacks is FailedPrecondition naming the
// command that pushes it; a registry that cannot be reached is
// ErrUnavailable (registry.Client's classes otherwise).
func (c *digestCache) resolve(ctx context.Context, name, tag string) (string, error) {
	key := name + ":" + tag
	c.mu.Lock()
	digest, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return digest, nil
	}
	digest, err := c.client.Resolve(ctx, name, tag)
	if errdefs.IsNotFound(err) {
		return "", fmt.Errorf("kubernetes: image %s: %w", name, errdefs.Publicf("the registry of kubernetes.registry has no image %q tagged %s; push it with `stockade image push`: %w", name, tag, errdefs.ErrFailedPrecondition))
	}
	if err != nil {
		return "", fmt.Errorf("kubernetes: resolving image %s:%s in kubernetes.registry: %w", name, tag, err)
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]string{}
	}
	c.m[key] = digest
	c.mu.Unlock()
	return digest, nil
}

// WriteImageArchive writes img's root filesystem, with the guest at
// guestPath as profile.GuestPath, to w as a Docker image archive (one layer,
// its manifest.json naming ref), which `ctr -n k8s.io images import` loads
// into a node's containerd under ref. The layer is staged in a temporary
// file under tmpDir (its digest goes before it in the archive).
func WriteImageArchive(w io.Writer, img sandbox.Image, guestPath, ref, tmpDir string) error {
	if !filepath.IsAbs(img.Rootfs) {
		return fmt.Errorf("image rootfs %q is not an absolute path: %w", img.Rootfs, errdefs.ErrInvalidArgument)
	}
	f, err := os.CreateTemp(tmpDir, "layer-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	if err := writeTree(io.MultiWriter(f, h), img.Rootfs, guestPath); err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	config, err := imageConfig("sha256:" + hex.EncodeToString(h.Sum(nil)))
	if err != nil {
		return err
	}
	manifest, err := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{ref}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {"config.json", config}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "layer.tar", Mode: 0o644, Size: size}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, size); err != nil {
		return err
	}
	return tw.Close()
}

// writeTree writes the tree at rootfs, with the guest at guestPath, to w
// as a tar stream (imagetar.WriteTree, as driver/docker's import), and the
// termination message file's mount point in a directory only root may
// enter (TerminationLogPath).
func writeTree(w io.Writer, rootfs, guestPath string) error {
	tw := tar.NewWriter(w)
	if err := imagetar.WriteTree(tw, rootfs, guestPath); err != nil {
		return err
	}
	dir := strings.TrimPrefix(TerminationLogDir, "/")
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o700}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(TerminationLogPath, "/"), Mode: 0o600}); err != nil {
		return err
	}
	return tw.Close()
}

// guestDigest caches the digest of the guest binary while the file looks
// unchanged.
type guestDigest struct {
	mu    sync.Mutex
	size  int64
	mtime time.Time
	sum   string
}

// hex returns the hex sha256 of the guest binary at path.
func (g *guestDigest) hex(path string) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("guest agent %s: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	if g.sum != "" && g.size == fi.Size() && g.mtime.Equal(fi.ModTime()) {
		return g.sum, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("guest agent %s: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing guest agent: %w", err)
	}
	g.size, g.mtime, g.sum = fi.Size(), fi.ModTime(), hex.EncodeToString(h.Sum(nil))
	return g.sum, nil
}

// GuestDigest returns the hex sha256 of the guest binary at path, as
// ImageRef wants it.
func GuestDigest(path string) (string, error) {
	var g guestDigest
	return g.hex(path)
}

// pullFailure is the error of pod's container waiting for reason with
// the kubelet's message msg on the pull of image, or nil for any other
// wait. Only with a registry configured (registry), an image by digest
// whose manifest or blob the registry says it lacks (containerd's "not
// found", the registry's MANIFEST_UNKNOWN or BLOB_UNKNOWN) is
// FailedPrecondition, naming the command that pushes it: nothing but a
// push mends it. Any other failed pull (the registry down or unreachable,
// credentials refused, rate limits) is the kubelet's message as
// ErrUnavailable, which a client retries.
//
// Kubelets since 1.31 append the last pull's error to an
// ImagePullBackOff's message ("Back-off pulling image X: ErrImagePull:
// ..."), so lacked sees it. An older kubelet's, or one's that restarted
// since the pull failed, says only "Back-off pulling image X", which
// cannot be told from a registry that is down: it stays ErrUnavailable.
// That costs little since the driver resolves every image's tag in the
// registry (digestCache) before it makes the pod: a manifest the registry
// lacks is refused then, with the push hint; only one deleted since, or
// its blobs, reach the kubelet.
func pullFailure(pod, image string, w *corev1.ContainerStateWaiting, registry bool) error {
	if w.Reason != "ErrImagePull" && w.Reason != "ImagePullBackOff" {
		return nil
	}
	if registry && strings.Contains(image, "@sha256:") && lacked(w.Message) {
		return notPushed(pod, image, w)
	}
	return fmt.Errorf("the container of pod %s cannot pull its image %s (%s): %s: %w", pod, image, w.Reason, w.Message, errdefs.ErrUnavailable)
}

// lacked tells whether the kubelet's message msg on a pull says the
// registry has no such manifest or blob (an image reference has no
// spaces, so these words come from the error).
func lacked(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "not found") || strings.Contains(msg, "manifest unknown") || strings.Contains(msg, "blob unknown")
}

// notPushed is the error of pod's container that waits on the pull of
// ref, an image of the registry by digest that the registry lacks,
// although the driver found its tag there (digestCache): the manifest or
// its blobs were deleted since. It names the command that pushes, for
// whoever reads the error; the kubelet's own message stays out of what
// the client reads.
func notPushed(pod, ref string, w *corev1.ContainerStateWaiting) error {
	name := ref[:strings.Index(ref, "@")]
	name = name[strings.LastIndexByte(name, '/')+1:]
	return fmt.Errorf("pod %s: the kubelet cannot pull %s (%s: %s): %w", pod, ref, w.Reason, w.Message,
		errdefs.Publicf("the registry of kubernetes.registry has no image %q with this digest; push it again with `stockade image push` (and restart the daemon, which remembers the digest): %w", name, errdefs.ErrFailedPrecondition))
}
