package npm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// maxPackumentBytes bounds one package's registry document. Full
// documents of packages with thousands of versions run to tens of MiB
// (a registry may answer the full document to the abbreviated one's
// Accept).
const maxPackumentBytes = 64 << 20

// packument is a package's registry document: its dist-tags and its
// versions' manifests, each decoded only when chosen (old versions of
// old packages hold fields of types no later npm writes).
type packument struct {
	Name     string
	DistTags map[string]string
	Versions map[string]json.RawMessage
	// sorted are the versions that parse, highest first.
	sorted []version
	raw    map[string]string // a parsed version's String() -> its key in Versions
}

// decodePackument reads a registry document of at most limit bytes.
func decodePackument(r io.Reader, limit int64) (*packument, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d MiB", limit>>20)
	}
	var doc struct {
		Name     string                     `json:"name"`
		DistTags map[string]json.RawMessage `json:"dist-tags"`
		Versions map[string]json.RawMessage `json:"versions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, errors.New("not a package document")
	}
	p := &packument{Name: doc.Name, DistTags: map[string]string{}, Versions: doc.Versions, raw: map[string]string{}}
	for tag, raw := range doc.DistTags {
		var v string
		if json.Unmarshal(raw, &v) == nil {
			p.DistTags[tag] = v
		}
	}
	for key := range doc.Versions {
		v, err := parseVersion(key)
		if err != nil {
			continue // a version npm itself could not install
		}
		if _, dup := p.raw[v.String()]; dup {
			continue
		}
		p.raw[v.String()] = key
		p.sorted = append(p.sorted, v)
	}
	sort.Slice(p.sorted, func(i, j int) bool { return compare(p.sorted[i], p.sorted[j]) > 0 })
	return p, nil
}

// manifest is what Resolve reads of one version of a package.
type manifest struct {
	Name, Version string
	Dependencies  map[string]string
	// Optional are optionalDependencies (npm also lists them among
	// Dependencies).
	Optional map[string]string
	Peer     map[string]string
	// PeerOptional names the peers peerDependenciesMeta marks optional.
	PeerOptional map[string]bool
	// Bundled are dependencies shipped inside the tarball, not resolved.
	Bundled   map[string]bool
	Tarball   string
	Integrity string
	Shasum    string
	// Scripts: the manifest has a preinstall, install or postinstall
	// script, or a binding.gyp (which npm builds with node-gyp).
	Scripts       bool
	OS, CPU, Libc []string
}

// manifest decodes a version's manifest.
func (p *packument) manifest(v version) (*manifest, error) {
	key, ok := p.raw[v.String()]
	if !ok {
		return nil, errors.New("no such version")
	}
	var raw struct {
		Name                 string                     `json:"name"`
		Version              string                     `json:"version"`
		Dependencies         json.RawMessage            `json:"dependencies"`
		OptionalDependencies json.RawMessage            `json:"optionalDependencies"`
		PeerDependencies     json.RawMessage            `json:"peerDependencies"`
		PeerDependenciesMeta map[string]json.RawMessage `json:"peerDependenciesMeta"`
		BundleDependencies   json.RawMessage            `json:"bundleDependencies"`
		BundledDependencies  json.RawMessage            `json:"bundledDependencies"`
		Dist                 struct {
			Tarball   string `json:"tarball"`
			Integrity string `json:"integrity"`
			Shasum    string `json:"shasum"`
		} `json:"dist"`
		HasInstallScript bool                       `json:"hasInstallScript"`
		Gypfile          bool                       `json:"gypfile"`
		Scripts          map[string]json.RawMessage `json:"scripts"`
		OS               json.RawMessage            `json:"os"`
		CPU              json.RawMessage            `json:"cpu"`
		Libc             json.RawMessage            `json:"libc"`
	}
	if err := json.Unmarshal(p.Versions[key], &raw); err != nil {
		return nil, errors.New("its manifest cannot be read")
	}
	m := &manifest{Name: raw.Name, Version: raw.Version, Tarball: raw.Dist.Tarball, Integrity: raw.Dist.Integrity, Shasum: raw.Dist.Shasum}
	var err error
	if m.Dependencies, err = stringMap(raw.Dependencies); err != nil {
		return nil, fmt.Errorf("dependencies: %w", err)
	}
	if m.Optional, err = stringMap(raw.OptionalDependencies); err != nil {
		return nil, fmt.Errorf("optionalDependencies: %w", err)
	}
	if m.Peer, err = stringMap(raw.PeerDependencies); err != nil {
		return nil, fmt.Errorf("peerDependencies: %w", err)
	}
	m.PeerOptional = map[string]bool{}
	for name, meta := range raw.PeerDependenciesMeta {
		var o struct {
			Optional bool `json:"optional"`
		}
		if json.Unmarshal(meta, &o) == nil && o.Optional {
			m.PeerOptional[name] = true
		}
	}
	m.Bundled = map[string]bool{}
	for _, b := range []json.RawMessage{raw.BundleDependencies, raw.BundledDependencies} {
		var all bool
		var names []string
		switch {
		case json.Unmarshal(b, &all) == nil && all:
			for name := range m.Dependencies {
				m.Bundled[name] = true
			}
		case json.Unmarshal(b, &names) == nil:
			for _, n := range names {
				m.Bundled[n] = true
			}
		}
	}
	m.Scripts = raw.HasInstallScript || raw.Gypfile
	for _, s := range []string{"preinstall", "install", "postinstall"} {
		if _, ok := raw.Scripts[s]; ok {
			m.Scripts = true
		}
	}
	m.OS, m.CPU, m.Libc = stringList(raw.OS), stringList(raw.CPU), stringList(raw.Libc)
	return m, nil
}

// deps are the dependencies Resolve installs: dependencies and optional
// dependencies, less the bundled ones.
func (m *manifest) deps() map[string]string {
	deps := make(map[string]string, len(m.Dependencies)+len(m.Optional))
	for name, rng := range m.Dependencies {
		deps[name] = rng
	}
	for name, rng := range m.Optional {
		deps[name] = rng
	}
	for name := range m.Bundled {
		delete(deps, name)
	}
	return deps
}

// stringMap decodes a map of strings; an absent or null one is empty,
// and an empty array (which old manifests wrote for "none") too.
func stringMap(b json.RawMessage) (map[string]string, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" || string(b) == "[]" || string(b) == "{}" {
		return map[string]string{}, nil
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errors.New("not a map of names to versions")
	}
	return m, nil
}

// stringList decodes a list of strings, or one string; anything else is
// empty.
func stringList(b json.RawMessage) []string {
	var l []string
	if json.Unmarshal(b, &l) == nil {
		return l
	}
	var s string
	if json.Unmarshal(b, &s) == nil && s != "" {
		return []string{s}
	}
	return nil
}

// platformOK reports whether a manifest's os, cpu and libc lists allow
// the images' platform: linux, x64, glibc. A list allows a value it
// names, or that it does not exclude with "!" when it has only
// exclusions.
func (m *manifest) platformOK() bool {
	return allows(m.OS, "linux") && allows(m.CPU, "x64") && allows(m.Libc, "glibc")
}

func allows(list []string, v string) bool {
	if len(list) == 0 {
		return true
	}
	onlyExcl := true
	for _, e := range list {
		if e == "!"+v {
			return false
		}
		if e == v || e == "any" {
			return true
		}
		if !strings.HasPrefix(e, "!") {
			onlyExcl = false
		}
	}
	return onlyExcl
}

// pick chooses a version in r as npm does: the "latest" dist-tag when it
// is in r and not deprecated, else the highest version in r that is not
// deprecated, else the highest in r. A prerelease is only chosen when r
// names one. (npm also prefers versions whose engines allow the running
// node; the image's node is not known here, so engines are not read.)
func (p *packument) pick(r semverRange) (version, bool) {
	if l, ok := p.DistTags["latest"]; ok {
		if v, err := parseVersion(l); err == nil {
			if _, known := p.raw[v.String()]; known && r.test(v) && !p.deprecated(v) {
				return v, true
			}
		}
	}
	var first *version
	for i, v := range p.sorted {
		if !r.test(v) {
			continue
		}
		if !p.deprecated(v) {
			return v, true
		}
		if first == nil {
			first = &p.sorted[i]
		}
	}
	if first != nil {
		return *first, true
	}
	return version{}, false
}

// deprecated reports whether a version carries a deprecation message.
func (p *packument) deprecated(v version) bool {
	var d struct {
		Deprecated json.RawMessage `json:"deprecated"`
	}
	if json.Unmarshal(p.Versions[p.raw[v.String()]], &d) != nil {
		return false
	}
	var msg string
	if json.Unmarshal(d.Deprecated, &msg) == nil {
		return msg != ""
	}
	var b bool
	return json.Unmarshal(d.Deprecated, &b) == nil && b
}
