package templatejobs

import (
	"reflect"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/image"
)

// TestBuildOf checks the wire form of a template image's manifest: the
// Debian packages the template added with their versions from the
// image's package list, wheels, npm packages and files with their hashes.
func TestBuildOf(t *testing.T) {
	created := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	m := image.Manifest{Name: "analytics", Digest: "sha256:d", Created: created, SizeBytes: 42,
		Packages: map[string]string{"python3": "3.13.5-1", "python3-bs4": "4.13.4-2", "python3-soupsieve": "2.7-1"},
		Template: &image.TemplateManifest{Name: "analytics", Base: "python", Key: "sha256:k", Declaration: "sha256:decl",
			DebianAdded: []string{"python3-bs4", "python3-soupsieve"},
			Wheels:      []image.TemplateWheel{{Name: "tinyutil", Version: "1.2.0", SHA256: "ab"}},
			NPM:         []image.TemplateNPM{{Name: "left-pad", Version: "1.3.0", Integrity: "sha512-x"}},
			Files:       []image.TemplateFile{{Target: "/opt/rates.json", SHA256: "cd"}}}}
	want := client.TemplateBuild{Digest: "sha256:d", Key: "sha256:k", Declaration: "sha256:decl", Base: "python", Created: created, SizeBytes: 42,
		SBOM: client.SBOM{
			Debian:   []client.DebianPackage{{Name: "python3-bs4", Version: "4.13.4-2"}, {Name: "python3-soupsieve", Version: "2.7-1"}},
			Wheels:   []client.WheelPackage{{Name: "tinyutil", Version: "1.2.0", SHA256: "ab"}},
			NPM:      []client.NPMPackage{{Name: "left-pad", Version: "1.3.0", Integrity: "sha512-x"}},
			Files:    []client.TemplateFile{{Target: "/opt/rates.json", SHA256: "cd"}},
			Packages: m.Packages}}
	if got := BuildOf(m); !reflect.DeepEqual(got, want) {
		t.Errorf("BuildOf:\n got %+v\nwant %+v", got, want)
	}
	// A runtime's image has no template: no keys, an empty SBOM.
	if got := BuildOf(image.Manifest{Digest: "sha256:r"}); got.Key != "" || got.SBOM.Debian == nil || len(got.SBOM.Debian) != 0 {
		t.Errorf("BuildOf of a runtime's manifest: got %+v, want no key and empty lists", got)
	}
}
