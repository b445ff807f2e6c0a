package kubernetes

import (
	"archive/tar"
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
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// How a pod refers to its image. The choice made here (docs/kubernetes.md
// tells the operator): each runtime image, with the guest agent at
// profile.GuestPath, is an OCI image named by ImageRef, a content-addressed
// tag in the registry domain stockade.invalid, which no name server
// resolves: the image is imported on each node (`ctr -n k8s.io images
// import` of what WriteImageArchive writes) and the kubelet never pulls it
// (imagePullPolicy Never). A cluster with a registry sets Config.ImageRef
// to name the pushed image by its digest instead (`stockade image push` is
// the follow-up).

// ImageDomain is the registry domain of the images ImageRef names.
const ImageDomain = "stockade.invalid"

// archiveFormat names how WriteImageArchive builds the layer; it changes
// whenever its output does, so that no node keeps an image of an older
// driver under the same name.
const archiveFormat = "k2"

var (
	repoName = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*$`)
	sha256ID = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ImageRef is the name of img with the guest whose sha256 is guestHex, as
// an image imported on the node:
// stockade.invalid/<runtime>:<image digest[:12]>-<guest digest[:12]>-k1.
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
	if !repoName.MatchString(name) {
		name = "image"
	}
	return ImageDomain + "/" + name + ":" + img.Digest[len("sha256:"):][:12] + "-" + guestHex[:12] + "-" + archiveFormat, nil
}

// imageRef is the image of img's pods and its pull policy.
func (d *Driver) imageRef(img sandbox.Image) (string, corev1.PullPolicy, error) {
	if d.cfg.ImageRef != nil {
		return d.cfg.ImageRef(img)
	}
	sum, err := d.guest.hex(d.cfg.GuestPath)
	if err != nil {
		return "", "", err
	}
	ref, err := ImageRef(img, sum)
	return ref, corev1.PullNever, err
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
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"User": fmt.Sprintf("%d:%d", profile.Default().User.UID, profile.Default().User.GID)},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(h.Sum(nil))}},
	})
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
