package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
)

// A template's image (templates.Template) lives in the same
// content-addressed store as the runtime images, its ref in
// <root>/images/refs/templates/<name>. It is built from the current image
// of its base runtime: Debian packages into a cached layer (debian.go),
// then wheels, npm packages and files, hardened and checked as the
// runtime images are, its Start and Ready run once in a build sandbox
// (buildbox.go), hashed and published by rename (template_build.go).

// TemplateSources are where a template build fetches from: only these,
// from the host side (the build sandbox has no network).
type TemplateSources struct {
	// Mirror is the Debian mirror; empty means config.DefaultMirror.
	Mirror string
	// Wheelhouse is the directory of the operator's wheels (Wheel.File);
	// empty means none.
	Wheelhouse string
	// PythonIndex is a PEP 503 simple index for wheels named by
	// Wheel.Name; empty means none.
	PythonIndex string
	// NPMRegistry is the npm registry; empty means
	// config.DefaultNPMRegistry.
	NPMRegistry string
	// DataRoot is the data root (templates.Options.DataRoot), the only
	// directory a template's files are read from: the build checks again
	// that each source resolves under it and reads it through it. Empty
	// means none: a template with files is refused.
	DataRoot string
}

// TemplateOptions tune BuildTemplate. The zero value builds a template
// whose declaration and inputs changed since its last build, from the
// default sources, with "runsc" on PATH, without output.
type TemplateOptions struct {
	Sources TemplateSources
	// Pull resolves the packages again even if the declaration was built
	// before (newer Debian versions, say), instead of answering the
	// current build.
	Pull bool
	// RunscPath is the build sandbox's runsc; empty means "runsc" on PATH.
	RunscPath string
	// StateDir is where build sandboxes keep their runtime state, a
	// directory per sandbox removed after it; empty means the system's
	// temporary directory.
	StateDir string
	// Log receives the output of apt-get and of the build sandboxes; nil
	// discards it.
	Log io.Writer
	// Progress, if set, is called as the build moves on (as Build's; the
	// Progress's Runtime is the template's name). Stages: "resolving",
	// "downloading", "installing" (Debian packages), "wheels", "npm",
	// "files", "hardening", "checking", "hashing". Bytes is what was
	// downloaded while downloading, the tree's size after; Packages and
	// Total count the stage's packages. A build answered from the cache
	// reports nothing.
	Progress func(Progress)
}

// TemplateManifest is what a manifest of a template's image adds
// (Manifest.Template): the declaration it was built from and its bill of
// materials beyond the Debian packages (which Manifest.Packages lists,
// each with its version, the base's included).
type TemplateManifest struct {
	// Name is the template's name; Base its base runtime.
	Name string `json:"name"`
	Base string `json:"base"`
	// Key is the digest of the declaration and of every input (the base
	// image's digest, wheel and file hashes, the sources): BuildTemplate
	// answers a build of the same Key with this image.
	Key string `json:"key"`
	// Declaration is templates.Key of the declaration built.
	Declaration string `json:"declaration"`
	// Env, Workdir, Start, Ready and Golden are the declaration's, for the
	// engine.
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	Start   string            `json:"start,omitempty"`
	Ready   string            `json:"ready,omitempty"`
	Golden  bool              `json:"golden,omitempty"`
	// DebianAdded are the Debian packages installed beyond the base's
	// (the declared ones and their dependencies), sorted.
	DebianAdded []string `json:"debian_added,omitempty"`
	// Wheels, NPM and Files are what was installed of each kind.
	Wheels []TemplateWheel `json:"wheels,omitempty"`
	NPM    []TemplateNPM   `json:"npm,omitempty"`
	Files  []TemplateFile  `json:"files,omitempty"`
	// Layer names the cached Debian layer the image was built on (a
	// directory of <root>/cache/layers); empty without Debian packages.
	Layer string `json:"layer,omitempty"`
}

// TemplateWheel is one installed python wheel.
type TemplateWheel struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// TemplateNPM is one installed npm package.
type TemplateNPM struct {
	Name      string `json:"name"`
	Version   string `json:"version"`
	Integrity string `json:"integrity"`
}

// TemplateFile is one operator file copied into the image.
type TemplateFile struct {
	Target string `json:"target"`
	SHA256 string `json:"sha256"`
}

// clone returns a deep copy of m.
func (m *TemplateManifest) clone() *TemplateManifest {
	if m == nil {
		return nil
	}
	c := *m
	c.Env = maps.Clone(m.Env)
	c.DebianAdded = slices.Clone(m.DebianAdded)
	c.Wheels, c.NPM, c.Files = slices.Clone(m.Wheels), slices.Clone(m.NPM), slices.Clone(m.Files)
	return &c
}

// templateRefsDir holds the templates' refs.
func (s *Store) templateRefsDir() string { return filepath.Join(s.refsDir(), "templates") }

// BuildTemplate makes sure the image of t exists and returns its manifest.
// t must be valid (templates.Validate). The base runtime's image must be
// built. If the current image of t was built from the same declaration
// and inputs (Manifest.Template.Key) and opts.Pull is false, it returns
// that at once: no copy, no network. Otherwise it builds a new image (see
// the package's files) and moves the template's ref to it; if anything
// fails or ctx is cancelled, the previous build stays current and nothing
// of the new one is left.
//
// Builds of one store run one at a time (the store's lock); a second build
// of the same declaration waits and then finds the first's image. Errors
// the declaration causes name its field ("debian_packages: ...",
// "start: ...") and are public and ErrInvalidArgument; a full disk is
// ErrResourceExhausted; a mirror that cannot be reached ErrUnavailable.
func (s *Store) BuildTemplate(ctx context.Context, t templates.Template, opts TemplateOptions) (Manifest, error) {
	rt, ok := Runtimes[t.Base]
	if !ok || !templates.NamePattern.MatchString(t.Name) || Runtimes[t.Name].Name != "" {
		return Manifest{}, errdefs.Publicf("template %q with base %q cannot be built: validate it first: %w", t.Name, t.Base, errdefs.ErrInvalidArgument)
	}
	if opts.Sources.Mirror == "" {
		opts.Sources.Mirror = config.DefaultMirror
	}
	if opts.Sources.NPMRegistry == "" {
		opts.Sources.NPMRegistry = config.DefaultNPMRegistry
	}
	if err := checkMirror(opts.Sources.Mirror); err != nil {
		return Manifest{}, err
	}
	b := &templateBuild{s: s, t: t, rt: rt, opts: opts, mirror: opts.Sources.Mirror, prog: newProgress(opts.Progress, t.Name)}
	if m, hit, err := b.cached(); err != nil || hit {
		return m, err
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return Manifest{}, err
	}
	defer unlock()
	// Another build may have made it while this one waited for the lock.
	if m, hit, err := b.cached(); err != nil || hit {
		return m, err
	}
	if err := s.cleanTmp(); err != nil {
		return Manifest{}, err
	}
	m, err := b.build(ctx)
	if err != nil {
		return Manifest{}, fmt.Errorf("building template %q: %w", t.Name, err)
	}
	return m, nil
}

// cached reports whether the current image of the template was built
// from the build's key, with Pull off, and returns it if so. On the way
// it reads the base image (b.base) and computes the key (b.key); an
// error is one of those steps'.
func (b *templateBuild) cached() (m Manifest, hit bool, err error) {
	base, _, err := b.s.load(b.t.Base)
	if errdefs.IsNotFound(err) {
		return Manifest{}, false, errdefs.Publicf("template %q: its base image %q is not built; build the %s image first (stockade image build %s): %w", b.t.Name, b.t.Base, b.t.Base, b.t.Base, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return Manifest{}, false, err
	}
	if b.key, err = b.computeKey(base); err != nil {
		return Manifest{}, false, err
	}
	b.base = base
	if b.opts.Pull {
		return Manifest{}, false, nil
	}
	// A current build that cannot be loaded is rebuilt.
	m, _, err = b.s.loadTemplate(b.t.Name)
	if err != nil || m.Template.Key != b.key {
		return Manifest{}, false, nil
	}
	return m, true, nil
}

// ResolveTemplate returns the current image of the template name, ready to
// put in a sandbox.Spec (its Name is the template's), and its manifest,
// whose Template says its base runtime and what a sandbox of it runs at
// start. It is as cheap as Resolve. A template never built is a public
// ErrNotFound; a damaged image ErrFailedPrecondition.
func (s *Store) ResolveTemplate(name string) (sandbox.Image, Manifest, error) {
	m, img, err := s.loadTemplate(name)
	return img, m, err
}

// Templates returns the manifests of the current build of every template
// that has one, by name. Builds that cannot be loaded are left out and
// reported in the error.
func (s *Store) Templates() ([]Manifest, error) {
	names, err := s.templateNames()
	if err != nil {
		return nil, err
	}
	var out []Manifest
	var errs []error
	for _, n := range names {
		m, _, err := s.loadTemplate(n)
		switch {
		case err == nil:
			out = append(out, m)
		case !errdefs.IsNotFound(err):
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// templateNames lists the templates that have a ref, sorted.
func (s *Store) templateNames() ([]string, error) {
	ents, err := os.ReadDir(s.templateRefsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", classify(err))
	}
	var names []string
	for _, e := range ents {
		if templates.NamePattern.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// loadTemplate resolves the template name to its manifest and image.
func (s *Store) loadTemplate(name string) (Manifest, sandbox.Image, error) {
	if !templates.NamePattern.MatchString(name) {
		return Manifest{}, sandbox.Image{}, errdefs.Publicf("%q is not a template name: %w", name, errdefs.ErrInvalidArgument)
	}
	data, err := os.ReadFile(filepath.Join(s.templateRefsDir(), name))
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, sandbox.Image{}, errdefs.Publicf("template %q is not built; run `stockade template build %s`: %w", name, name, errdefs.ErrNotFound)
	}
	if err != nil {
		return Manifest{}, sandbox.Image{}, fmt.Errorf("reading ref of template %q: %w", name, classify(err))
	}
	damaged := func(why string) error {
		return fmt.Errorf("the image of template %q is damaged (%s); rebuild it with `stockade template build --pull %s`: %w", name, why, name, errdefs.ErrFailedPrecondition)
	}
	digest := strings.TrimSpace(string(data))
	hexd, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || !hexDigest.MatchString(hexd) {
		return Manifest{}, sandbox.Image{}, damaged(fmt.Sprintf("ref holds %q, not a sha256 digest", digest))
	}
	m, err := s.readManifestFile(filepath.Join(s.imageDir(hexd), "manifest.json"))
	if err != nil {
		return Manifest{}, sandbox.Image{}, damaged(err.Error())
	}
	if m.Template == nil || m.Template.Name != name {
		return Manifest{}, sandbox.Image{}, damaged("its manifest is not the template's")
	}
	rt, ok := Runtimes[m.Template.Base]
	if !ok {
		return Manifest{}, sandbox.Image{}, damaged(fmt.Sprintf("unknown base %q", m.Template.Base))
	}
	if m, err = s.checkImage(hexd, rt); err != nil {
		return Manifest{}, sandbox.Image{}, damaged(err.Error())
	}
	return m, sandbox.Image{Name: name, Digest: m.Digest, Rootfs: filepath.Join(s.imageDir(hexd), "rootfs")}, nil
}

// writeTemplateRef points the ref of the template name at digest.
func (s *Store) writeTemplateRef(name, digest string) error {
	if err := os.MkdirAll(s.templateRefsDir(), fsmode.Dir); err != nil {
		return fmt.Errorf("creating template refs: %w", classify(err))
	}
	if err := writeFileAtomic(s.templateRefsDir(), name, []byte(digest+"\n"), fsmode.File); err != nil {
		return fmt.Errorf("writing ref of template %q: %w", name, classify(err))
	}
	return nil
}

// usedTemplates returns the hex digests and the layers the templates'
// current builds use.
func (s *Store) usedTemplates() (digests, layers map[string]bool, err error) {
	digests, layers = map[string]bool{}, map[string]bool{}
	names, err := s.templateNames()
	if err != nil {
		return nil, nil, err
	}
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(s.templateRefsDir(), n))
		if err != nil {
			return nil, nil, fmt.Errorf("reading ref of template %q: %w", n, classify(err))
		}
		hexd := strings.TrimPrefix(strings.TrimSpace(string(data)), "sha256:")
		digests[hexd] = true
		if m, err := s.readManifestFile(filepath.Join(s.imageDir(hexd), "manifest.json")); err == nil && m.Template != nil && m.Template.Layer != "" {
			layers[m.Template.Layer] = true
		}
	}
	return digests, layers, nil
}

// sortedCopy returns a sorted copy of list.
func sortedCopy(list []string) []string {
	c := slices.Clone(list)
	slices.Sort(c)
	return c
}
