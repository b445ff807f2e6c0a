package templatejobs

import (
	"context"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/templates"
)

// StoreBuilder is the Builder of an image store: image.Store's
// BuildTemplate with Options (Pull and Progress are the job's).
type StoreBuilder struct {
	Store   *image.Store
	Options image.TemplateOptions
}

var _ Builder = StoreBuilder{}

// Build builds t with the store. A build whose image is the current one,
// as it was (the same digest and creation), is a cache hit.
func (b StoreBuilder) Build(ctx context.Context, t templates.Template, pull bool, progress func(image.Progress)) (client.TemplateBuild, bool, error) {
	_, prev, perr := b.Store.ResolveTemplate(t.Name)
	o := b.Options
	o.Pull, o.Progress = pull, progress
	m, err := b.Store.BuildTemplate(ctx, t, o)
	if err != nil {
		return client.TemplateBuild{}, false, err
	}
	hit := perr == nil && prev.Digest == m.Digest && prev.Created.Equal(m.Created)
	return BuildOf(m), hit, nil
}

// Current returns the template's current build; nil when it has none.
func (b StoreBuilder) Current(name string) (*client.TemplateBuild, error) {
	_, m, err := b.Store.ResolveTemplate(name)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	tb := BuildOf(m)
	return &tb, nil
}

// BuildOf is the wire form of a template image's manifest: its digest,
// keys and SBOM.
func BuildOf(m image.Manifest) client.TemplateBuild {
	b := client.TemplateBuild{Digest: m.Digest, Created: m.Created, SizeBytes: m.SizeBytes,
		SBOM: client.SBOM{Debian: []client.DebianPackage{}, Wheels: []client.WheelPackage{}, NPM: []client.NPMPackage{},
			Files: []client.TemplateFile{}, Packages: m.Packages}}
	t := m.Template
	if t == nil {
		return b
	}
	b.Key, b.Declaration, b.Base = t.Key, t.Declaration, t.Base
	for _, p := range t.DebianAdded {
		b.SBOM.Debian = append(b.SBOM.Debian, client.DebianPackage{Name: p, Version: m.Packages[p]})
	}
	for _, w := range t.Wheels {
		b.SBOM.Wheels = append(b.SBOM.Wheels, client.WheelPackage{Name: w.Name, Version: w.Version, SHA256: w.SHA256})
	}
	for _, n := range t.NPM {
		b.SBOM.NPM = append(b.SBOM.NPM, client.NPMPackage{Name: n.Name, Version: n.Version, Integrity: n.Integrity})
	}
	for _, f := range t.Files {
		b.SBOM.Files = append(b.SBOM.Files, client.TemplateFile{Target: f.Target, SHA256: f.SHA256})
	}
	return b
}
