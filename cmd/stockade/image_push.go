package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/registry"
	"github.com/stockade-sh/stockade/sandbox"
)

// imagePush pushes runtime and template images, with the guest, to a
// registry as OCI images (kubernetes.NewOCIImage), each under the tag
// that the kubernetes driver resolves to its digest (from the image's and
// the guest's digests), printing each one's reference by digest.
func imagePush(ctx context.Context, args []string) error {
	fs, root := imageFlags("push")
	insecure := fs.Bool("insecure", false, "allow plain http (http://HOST) to a registry that is not loopback")
	guest := fs.String("guest", "", "guest agent `FILE` to put in the images (default: the one embedded in stockade)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("image push wants a REGISTRY[/PREFIX]")
	}
	loc, err := registry.ParseLocation(pos[0], *insecure)
	if err != nil {
		return usageError{err}
	}
	c, err := registry.New(loc, registry.Options{
		Username: os.Getenv("STOCKADE_REGISTRY_USERNAME"), Password: os.Getenv("STOCKADE_REGISTRY_PASSWORD"),
	})
	if err != nil {
		return err
	}
	s := openImages(*root)
	// The images stay in use (no prune by hand removes them) while they
	// are read.
	release, err := s.Hold()
	if err != nil {
		return err
	}
	defer release()
	imgs, err := pushImages(s, pos[1:])
	if err != nil {
		return err
	}
	guestPath := *guest
	if guestPath == "" {
		if guestPath, err = guestbin.Install(config.Config{DataDir: *root}.BinDir()); err != nil {
			return err
		}
	}
	failed := 0
	for _, img := range imgs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		start := time.Now()
		ref, st, err := pushImage(ctx, c, loc, img, guestPath)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(os.Stderr, "stockade: %s: %v\n", img.Name, err)
			failed++
			continue
		}
		what := "already there"
		if st.Uploaded > 0 || st.ManifestPut {
			what = fmt.Sprintf("uploaded %d of %d blobs, %s", st.Uploaded, st.Blobs, formatSize(st.UploadedBytes))
		}
		fmt.Printf("%s: %s  (%s, %s)\n", img.Name, ref, what, time.Since(start).Round(100*time.Millisecond))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d images failed to push", failed, len(imgs))
	}
	return nil
}

// pushImage pushes img to c and returns its reference by digest.
func pushImage(ctx context.Context, c *registry.Client, loc registry.Location, img sandbox.Image, guestPath string) (string, registry.Stats, error) {
	o, err := kubernetes.NewOCIImage(img, guestPath)
	if err != nil {
		return "", registry.Stats{}, err
	}
	digest, st, err := c.Push(ctx, o.Name, o.Tag, o.Blobs(), o.Manifest)
	if err != nil {
		return "", st, err
	}
	return loc.Ref(o.Name, digest), st, nil
}

// pushImages resolves the images names names: runtimes and templates; no
// name means every runtime and every built template. Runtimes not built
// are left out of "every" with a note, named ones are an error.
func pushImages(s *image.Store, names []string) ([]sandbox.Image, error) {
	var out []sandbox.Image
	if len(names) == 0 {
		for _, n := range image.Names() {
			img, err := s.Resolve(n)
			if err != nil {
				fmt.Fprintf(os.Stderr, "stockade: %s: %v (skipped)\n", n, err)
				continue
			}
			out = append(out, img)
		}
		tms, err := s.Templates()
		if err != nil {
			fmt.Fprintf(os.Stderr, "stockade: %v (skipped)\n", err)
		}
		for _, m := range tms {
			img, _, err := s.ResolveTemplate(m.Template.Name)
			if err != nil {
				fmt.Fprintf(os.Stderr, "stockade: template %s: %v (skipped)\n", m.Template.Name, err)
				continue
			}
			out = append(out, img)
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("no image to push; build them with `stockade image build`")
		}
		return out, nil
	}
	var seen []string
	for _, n := range names {
		if slices.Contains(seen, n) {
			continue
		}
		seen = append(seen, n)
		var (
			img sandbox.Image
			err error
		)
		if _, ok := image.Runtimes[n]; ok {
			img, err = s.Resolve(n)
		} else {
			img, _, err = s.ResolveTemplate(n)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}
