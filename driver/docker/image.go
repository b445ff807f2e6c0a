package docker

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/jsonstream"
	"github.com/moby/moby/client"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/imagetar"
	"github.com/stockade-sh/stockade/sandbox"
)

// ImageRepo is the repository every imported runtime image is tagged in:
// stockade/<runtime>:<image digest[:12]>-<guest digest[:12]>-<treeFormat>.
const ImageRepo = "stockade/"

// treeFormat names how writeTree turns a rootfs into the imported layer; it
// changes whenever writeTree's output does, so that no engine keeps using
// an image made by an older driver.
const treeFormat = "t1"

var (
	repoName = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*$`)
	sha256ID = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ImageTag is the engine's name for img with the guest agent whose sha256
// is guestHex. Both digests and treeFormat are in the tag, so a rebuilt
// image, a new guest or a new driver gets a new engine image and never
// reuses a stale one.
func ImageTag(img sandbox.Image, guestHex string) (string, error) {
	if !sha256ID.MatchString(img.Digest) {
		return "", fmt.Errorf("image %q has digest %q, not sha256:<hex>: %w", img.Name, img.Digest, errdefs.ErrInvalidArgument)
	}
	name := img.Name
	if !repoName.MatchString(name) {
		name = "image"
	}
	return ImageRepo + name + ":" + img.Digest[len("sha256:"):][:12] + "-" + guestHex[:12] + "-" + treeFormat, nil
}

// ImportImage makes img, with the guest agent at /.stockade/guest, an image
// of the engine and returns its tag. An image the engine already has under
// that tag is not imported again. `stockade image build --docker` calls it
// ahead of time; Create calls it on first use.
func (d *Driver) ImportImage(ctx context.Context, img sandbox.Image) (string, error) {
	if img.Rootfs == "" || !filepath.IsAbs(img.Rootfs) {
		return "", fmt.Errorf("image rootfs %q is not an absolute path: %w", img.Rootfs, errdefs.ErrInvalidArgument)
	}
	guestHex, err := d.guestDigest()
	if err != nil {
		return "", err
	}
	tag, err := ImageTag(img, guestHex)
	if err != nil {
		return "", err
	}
	if d.knownImage(tag) {
		return tag, nil
	}
	// One import at a time; sandboxes of images already known do not wait,
	// and one waiting for another's import gives up with its ctx.
	select {
	case d.importing <- struct{}{}:
		defer func() { <-d.importing }()
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for another import of an image into the Docker engine: %w: %w", ctx.Err(), errdefs.ErrUnavailable)
	}
	if d.knownImage(tag) {
		return tag, nil
	}
	_, err = d.cli.ImageInspect(ctx, tag)
	switch {
	case err == nil:
	case cerrdefs.IsNotFound(err):
		if err := d.importTree(ctx, img.Rootfs, tag); err != nil {
			return "", err
		}
	default:
		return "", d.engineError("inspecting image "+tag+" in", err)
	}
	d.imageMu.Lock()
	d.images[tag] = true
	d.imageMu.Unlock()
	return tag, nil
}

// knownImage reports whether the engine was seen to have tag.
func (d *Driver) knownImage(tag string) bool {
	d.imageMu.Lock()
	defer d.imageMu.Unlock()
	return d.images[tag]
}

// forgetImage drops tag from the cache of known images.
func (d *Driver) forgetImage(tag string) {
	d.imageMu.Lock()
	defer d.imageMu.Unlock()
	delete(d.images, tag)
}

// importTree streams the tree at rootfs, with the guest added, into the
// engine's image import and tags the result.
func (d *Driver) importTree(ctx context.Context, rootfs, tag string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeTree(pw, rootfs, d.cfg.GuestPath))
	}()
	defer pr.Close() // stops writeTree when the import fails early
	resp, err := d.cli.ImageImport(ctx, client.ImageImportSource{Source: pr, SourceName: "-"}, tag, client.ImageImportOptions{
		Message: "stockade runtime image " + tag,
	})
	if err != nil {
		return d.engineError("importing image "+tag+" into", err)
	}
	defer resp.Close()
	// The engine answers with a stream of JSON messages; a failure is one
	// of them, not an HTTP status.
	dec := json.NewDecoder(io.LimitReader(resp, 1<<20))
	for {
		var m jsonstream.Message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return d.engineError("importing image "+tag+" into", err)
		}
		if m.Error != nil {
			return fmt.Errorf("importing image %s into the Docker engine: %s: %w", tag, m.Error.Message, errdefs.ErrUnavailable)
		}
	}
	if _, err := d.cli.ImageInspect(ctx, tag); err != nil {
		return d.engineError("inspecting imported image "+tag+" in", err)
	}
	return nil
}

// writeTree writes the tree at rootfs, with the guest at guestPath, to w
// as a tar stream (imagetar.WriteTree).
func writeTree(w io.Writer, rootfs, guestPath string) error {
	tw := tar.NewWriter(w)
	if err := imagetar.WriteTree(tw, rootfs, guestPath); err != nil {
		return err
	}
	return tw.Close()
}

// guestSum caches the digest of the guest binary for as long as the file
// looks unchanged.
type guestSum struct {
	size  int64
	mtime time.Time
	hex   string
}

// guestDigest returns the hex sha256 of the guest binary.
func (d *Driver) guestDigest() (string, error) {
	d.guestMu.Lock()
	defer d.guestMu.Unlock()
	fi, err := os.Stat(d.cfg.GuestPath)
	if err != nil {
		return "", fmt.Errorf("guest agent %s: %v: %w", d.cfg.GuestPath, err, errdefs.ErrUnavailable)
	}
	if g := d.guestSum; g.hex != "" && g.size == fi.Size() && g.mtime.Equal(fi.ModTime()) {
		return g.hex, nil
	}
	f, err := os.Open(d.cfg.GuestPath)
	if err != nil {
		return "", fmt.Errorf("guest agent %s: %v: %w", d.cfg.GuestPath, err, errdefs.ErrUnavailable)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing guest agent: %w", err)
	}
	d.guestSum = guestSum{size: fi.Size(), mtime: fi.ModTime(), hex: hex.EncodeToString(h.Sum(nil))}
	return d.guestSum.hex, nil
}
