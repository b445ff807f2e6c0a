package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/image"
)

func init() {
	commands["image"] = command{summary: "build, list, verify, prune and push runtime images", run: runImage}
}

const imageUsage = `usage: stockade image build [--force] [--data-dir DIR] [--mirror URL] [-v] [NAME...]
       stockade image list [--data-dir DIR] [--json]
       stockade image verify [--data-dir DIR] [NAME...]
       stockade image prune [--data-dir DIR]
       stockade image push [--data-dir DIR] [--insecure] [--guest FILE] REGISTRY[/PREFIX] [NAME...]

NAME is a runtime: python, node or shell. No NAME means all of them. The
images are in the data directory: --data-dir, env STOCKADE_DATA_DIR, or
/var/lib/stockade, as for every other command.
build   builds missing or damaged images with debootstrap (needs root and the
        Debian mirror); --force rebuilds them.
list    shows the images in the store.
verify  re-hashes images and checks them against their digests.
prune   deletes images no ref points to (left behind by forced rebuilds and
        by later builds of templates); refused while a daemon uses the
        data directory (it prunes those its sandboxes no longer use after
        each template build and at its start). Without a daemon no sandbox
        may be running from them.
push    puts images, with the guest agent, in an OCI registry for the
        kubernetes driver (kubernetes.registry): each an OCI image of one
        layer, content-addressed, at REGISTRY/PREFIX/NAME, printed by
        digest. NAME may be a runtime or a built template; none means all
        runtimes and templates. Blobs the registry has are not uploaded
        again. REGISTRY is https unless named http:// (loopback only,
        unless --insecure); basic auth from STOCKADE_REGISTRY_USERNAME and
        STOCKADE_REGISTRY_PASSWORD (no token services, no docker config).
        The digest depends on the files as they lie in the data directory
        (mtimes, owners, hard links) and on the guest: push from the
        daemon's own data directory (or an exact copy) with the same
        stockade, or its pods will not find the image.
`

func runImage(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, imageUsage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "build":
		err = imageBuild(ctx, args[1:])
	case "list", "ls":
		err = imageList(args[1:])
	case "verify":
		err = imageVerify(ctx, args[1:])
	case "prune":
		err = imagePrune(args[1:])
	case "push":
		err = imagePush(ctx, args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(os.Stdout, imageUsage)
		return 0
	default:
		err = usagef("unknown image command %q; want build, list, verify, prune or push", args[0])
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// imageFlags returns a flag set for an image subcommand with the
// --data-dir flag every subcommand takes; its default is the environment's
// STOCKADE_DATA_DIR or the configuration's default. Its --help prints the
// image commands' usage.
// openImages opens the image store of the data directory root, once what
// an older install left open in it is made private.
func openImages(root string) *image.Store {
	fixDataDir(root)
	return image.Open(root)
}

func imageFlags(name string) (*flag.FlagSet, *string) {
	fs := newFlags("image "+name, imageUsage)
	root := fs.String("data-dir", defaultDataDir(), "data directory `DIR` holding the image store (env STOCKADE_DATA_DIR)")
	return fs, root
}

// runtimeArgs validates runtime names, drops duplicates, and defaults to all
// runtimes.
func runtimeArgs(names []string) ([]string, error) {
	if len(names) == 0 {
		return image.Names(), nil
	}
	var out []string
	for _, n := range names {
		if _, ok := image.Runtimes[n]; !ok {
			return nil, usagef("unknown runtime %q; want one of %s", n, strings.Join(image.Names(), ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

func imageBuild(ctx context.Context, args []string) error {
	fs, root := imageFlags("build")
	force := fs.Bool("force", false, "rebuild even if a valid image exists")
	mirror := fs.String("mirror", config.DefaultMirror, "Debian mirror `URL`")
	verbose := fs.Bool("v", false, "show debootstrap's output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	names, err := runtimeArgs(pos)
	if err != nil {
		return err
	}
	s := openImages(*root)
	opts := image.BuildOptions{Force: *force, Mirror: *mirror, Progress: progressPrinter(os.Stderr, 5*time.Second)}
	if *verbose {
		opts.Log = os.Stderr
	}
	failed := 0
	for _, name := range names {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if _, err := s.Current(name); err != nil || *force {
			fmt.Fprintf(os.Stderr, "%s: building with debootstrap (%s, minutes)...\n", name, image.Suite)
		}
		start := time.Now()
		m, err := s.Build(ctx, name, opts)
		if err != nil {
			fmt.Fprintf(os.Stderr, "stockade: %v\n", err)
			failed++
			continue
		}
		fmt.Printf("%s: %s  %s  %s  (%s)\n", name, m.Digest, formatSize(m.SizeBytes),
			keyPackage(m), time.Since(start).Round(100*time.Millisecond))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d images failed to build", failed, len(names))
	}
	return nil
}

func imageList(args []string) error {
	fs, root := imageFlags("list")
	asJSON := fs.Bool("json", false, "print the manifests as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("image list takes no arguments")
	}
	list, lerr := openImages(*root).List()
	if *asJSON {
		if list == nil {
			list = []image.Manifest{}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(list); err != nil {
			return fmt.Errorf("writing JSON: %w", err)
		}
		return lerr
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tCREATED\tPACKAGE")
	for _, m := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, shortDigest(m.Digest), formatSize(m.SizeBytes),
			m.Created.Local().Format("2006-01-02 15:04"), keyPackage(m))
	}
	tw.Flush()
	return lerr
}

func imageVerify(ctx context.Context, args []string) error {
	fs, root := imageFlags("verify")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	names, err := runtimeArgs(pos)
	if err != nil {
		return err
	}
	s := openImages(*root)
	failed := 0
	for _, name := range names {
		start := time.Now()
		if err := s.Verify(ctx, name); err != nil {
			if ctx.Err() != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "stockade: %v\n", err)
			failed++
			continue
		}
		img, _ := s.Resolve(name)
		fmt.Printf("%s: ok %s (%s)\n", name, img.Digest, time.Since(start).Round(10*time.Millisecond))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d images failed verification", failed, len(names))
	}
	return nil
}

func imagePrune(args []string) error {
	fs, root := imageFlags("prune")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("image prune takes no arguments")
	}
	pruned, err := openImages(*root).PruneIdle()
	for _, d := range pruned {
		fmt.Printf("removed %s\n", d)
	}
	if err == nil && len(pruned) == 0 {
		fmt.Println("nothing to prune")
	}
	return err
}

// progressPrinter prints a build's progress to w, one line per stage and,
// within a stage, at most one every interval: "python: unpacking 43 of 120
// packages, 212.4 MiB so far (47s)".
func progressPrinter(w io.Writer, interval time.Duration) func(image.Progress) {
	var (
		stage string
		last  time.Time
	)
	return func(p image.Progress) {
		if p.Stage == stage && time.Since(last) < interval {
			return
		}
		stage, last = p.Stage, time.Now()
		line := p.Runtime + ": " + p.Stage
		switch {
		case p.Total > 0:
			line += fmt.Sprintf(" %d of %d packages", p.Packages, p.Total)
		case p.Packages > 0:
			line += fmt.Sprintf(" %s", plural(p.Packages, "package"))
		}
		if p.Bytes > 0 {
			line += fmt.Sprintf(", %s so far", formatSize(p.Bytes))
		}
		fmt.Fprintf(w, "%s (%s)\n", line, p.Elapsed.Round(time.Second))
	}
}

// shortDigest abbreviates "sha256:<hex>" to its first 12 hex digits.
func shortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}

// keyPackage is "<package> <version>" of the package that identifies the
// image's runtime, e.g. "python3 3.13.5-1".
func keyPackage(m image.Manifest) string {
	rt, ok := image.Runtimes[m.Name]
	if !ok || len(rt.Packages) == 0 {
		return "-"
	}
	p := rt.Packages[0]
	v, ok := m.Packages[p]
	if !ok {
		return p + " ?"
	}
	return p + " " + v
}

func formatSize(n int64) string {
	const mib = 1 << 20
	if n < mib {
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/mib)
}
