package npm

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/stockade-sh/stockade/errdefs"
)

// Bounds of a resolution.
const (
	// maxPackages bounds the packages one template installs.
	maxPackages = 2000
	// fetchers bounds the registry documents fetched at once.
	fetchers = 6
	// maxDepth bounds how deep node_modules nest (a conflict nests a
	// package under its dependent; cycles of conflicts could nest
	// forever).
	maxDepth = 32
)

// namePattern is an npm package name: an optional scope and a name, of
// the characters npm allows (old packages have capitals). No element is
// "." or "..", so a name is a safe path under node_modules.
var namePattern = regexp.MustCompile(`^(@[a-z0-9~-][a-z0-9._~-]*/)?[a-zA-Z0-9~-][a-zA-Z0-9._~-]*$`)

// validName reports whether name is a package name npm could publish.
func validName(name string) bool {
	return len(name) <= 214 && namePattern.MatchString(name) && !strings.HasSuffix(name, "/node_modules") && name != "node_modules"
}

// tagPattern is a dist-tag ("latest", "next", "beta"): npm reads a spec
// that is not a range and looks like one as a tag.
var tagPattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]{0,63}$`)

// ParseSpec splits a template's npm package, "name@version" (a scoped
// name "@scope/name@version"), checking the version is exact.
func ParseSpec(spec string) (name, version string, err error) {
	i := strings.LastIndex(spec, "@")
	if i <= 0 {
		return "", "", errdefs.Publicf("npm_packages: %q: want name@version with an exact version: %w", spec, errdefs.ErrInvalidArgument)
	}
	name, version = spec[:i], spec[i+1:]
	if !validName(name) {
		return "", "", errdefs.Publicf("npm_packages: %q: %q is not an npm package name: %w", spec, name, errdefs.ErrInvalidArgument)
	}
	if _, err := parseVersion(version); err != nil || strings.HasPrefix(version, "v") || strings.HasPrefix(version, "=") {
		return "", "", errdefs.Publicf("npm_packages: %q: want an exact version such as 1.2.3, not %q: %w", spec, version, errdefs.ErrInvalidArgument)
	}
	return name, version, nil
}

// node is a package placed in the tree.
type node struct {
	name string
	v    version
	m    *manifest
	path string // under node_modules: "a", "a/node_modules/b"
	spec string // the template's spec that brought it in, for errors
}

// edge is a dependency resolved from a package (or the template, from
// "") to the package node resolution finds.
type edge struct {
	from, name, to string
}

// resolver is one Resolve's state.
type resolver struct {
	ctx      context.Context
	registry string
	docs     map[string]*packument
	docErrs  map[string]error
	tree     map[string]*node
	edges    []edge
	queue    []*node
	fetched  int

	// Documents are fetched in the background as soon as a placed
	// package names them (prefetch), a few at a time, so that the
	// registry's latency overlaps; resolving stays in one goroutine,
	// which alone reads and writes the maps.
	inflight map[string]*docFetch
	sem      chan struct{}
	wg       sync.WaitGroup
}

// docFetch is a registry document being fetched in the background. Its
// doc and err are set before done is closed.
type docFetch struct {
	done chan struct{}
	doc  *packument
	err  error
}

// Resolve reads the packages specs name ("name@1.2.3", exact versions)
// and their dependencies from the registry at registry and lays them out
// as npm does, in a tree under node_modules: each package as high as it
// can go (node_modules/<name>, the hoisted flat layout), nested under its
// dependent only when another version of it is already visible there. A
// dependency's range (npm's grammar: ^, ~, x-ranges, hyphen ranges, ||,
// comparators, "", "*", a dist-tag) chooses the "latest" dist-tag when it
// is in the range, else the range's highest version, never a prerelease
// the range does not name.
//
// What is not installed, and why:
//   - peerDependencies are the template's to list (npm 7 would add them):
//     a peer that is missing, or present in a version out of its range,
//     is an error naming it, unless peerDependenciesMeta marks it
//     optional and it is missing.
//   - optionalDependencies are installed when they resolve and allow
//     linux/x64/glibc, and skipped otherwise (as npm skips one that
//     fails); once one is placed, its own dependencies must resolve (npm
//     would drop the whole optional subtree instead).
//   - bundled dependencies come in their dependent's tarball.
//   - devDependencies are not a dependency's to install.
//
// A dependency given as a URL, a git repository, a file, an alias
// ("npm:") or a workspace is refused, as is a package whose os, cpu or
// libc excludes linux, x64 or glibc. Cycles resolve to the packages
// already placed. At most maxPackages packages are resolved.
//
// Every package's tarball must be on the registry's origin (scheme, host
// and port): a document naming one elsewhere is an error naming the
// package, since Install fetches from the registry only.
//
// Errors are public and name the template's spec that led to them:
// `npm_packages: "left-pad@9.9.9": no such version`.
func Resolve(ctx context.Context, registry string, specs []string) ([]Package, error) {
	u, err := url.Parse(registry)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("npm registry %q is not an http(s) URL: %w", registry, errdefs.ErrInvalidArgument)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &resolver{ctx: ctx, registry: strings.TrimSuffix(registry, "/"), docs: map[string]*packument{}, docErrs: map[string]error{},
		tree: map[string]*node{}, inflight: map[string]*docFetch{}, sem: make(chan struct{}, fetchers)}
	defer r.wg.Wait() // after cancel: no fetch outlives Resolve
	defer cancel()
	seen := map[string]string{}
	names := make([]string, len(specs))
	for i, spec := range specs {
		name, _, err := ParseSpec(spec)
		if err != nil {
			return nil, err
		}
		if prev, dup := seen[name]; dup {
			return nil, errdefs.Publicf("npm_packages: %q and %q name the same package: %w", prev, spec, errdefs.ErrInvalidArgument)
		}
		seen[name] = spec
		names[i] = name
		r.prefetch(name, spec, name)
	}
	for i, spec := range specs {
		name := names[i]
		_, ver, _ := ParseSpec(spec)
		doc, err := r.doc(name, spec, name)
		if err != nil {
			return nil, err
		}
		v, _ := parseVersion(ver)
		if _, ok := doc.raw[v.String()]; !ok {
			return nil, errdefs.Publicf("npm_packages: %q: no such version: %w", spec, errdefs.ErrNotFound)
		}
		if _, err := r.place(spec, "", name, v); err != nil {
			return nil, err
		}
	}
	for len(r.queue) > 0 {
		if err := r.dependencies(r.next()); err != nil {
			return nil, err
		}
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	out := make([]Package, 0, len(r.tree))
	for _, n := range r.tree {
		p := Package{Name: n.name, Version: n.v.String(), Resolved: n.m.Tarball, Path: n.path, Scripts: n.m.Scripts}
		p.Integrity, err = integrityOf(n.m)
		if err != nil {
			return nil, errdefs.Publicf("npm_packages: %q: %s@%s: %s: %w", n.spec, n.name, p.Version, err.Error(), errdefs.ErrInvalidArgument)
		}
		if err := checkOrigin(p.Resolved, r.registry); err != nil {
			return nil, tarballURLError(n.spec, p, r.registry, err)
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// doc returns a package's registry document, waiting for its fetch.
// spec and what name the template's spec and the dependency for errors
// (a document already being fetched keeps the names of the dependent
// that asked first).
func (r *resolver) doc(name, spec, what string) (*packument, error) {
	if d, ok := r.docs[name]; ok {
		return d, nil
	}
	if err, ok := r.docErrs[name]; ok {
		return nil, err
	}
	r.prefetch(name, spec, what)
	f, ok := r.inflight[name]
	if !ok {
		return nil, errdefs.Publicf("npm_packages: %q: more than %d packages: %w", spec, maxPackages, errdefs.ErrResourceExhausted)
	}
	<-f.done
	delete(r.inflight, name)
	if f.err != nil {
		r.docErrs[name] = f.err
		return nil, f.err
	}
	r.docs[name] = f.doc
	return f.doc, nil
}

// prefetch starts fetching a package's document in the background, if
// it is not fetched or being fetched, and at most maxPackages in all.
func (r *resolver) prefetch(name, spec, what string) {
	if _, ok := r.docs[name]; ok {
		return
	}
	if _, ok := r.docErrs[name]; ok {
		return
	}
	if _, ok := r.inflight[name]; ok || r.fetched >= maxPackages {
		return
	}
	r.fetched++
	f := &docFetch{done: make(chan struct{})}
	r.inflight[name] = f
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(f.done)
		select {
		case r.sem <- struct{}{}:
		case <-r.ctx.Done():
			f.err = r.ctx.Err()
			return
		}
		defer func() { <-r.sem }()
		f.doc, f.err = r.fetch(name, spec, what)
	}()
}

// fetch GETs a packument. It runs in its own goroutine and touches none
// of the resolver's maps.
func (r *resolver) fetch(name, spec, what string) (*packument, error) {
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, r.registry+"/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, fmt.Errorf("fetching %s from the npm registry: %w", name, err)
	}
	req.Header.Set("Accept", "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8, */*")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("npm_packages: %q: fetching %s from the npm registry: %w: %w", spec, name, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, errdefs.Publicf("npm_packages: %q: %s: no such package on the npm registry: %w", spec, what, errdefs.ErrNotFound)
	case resp.StatusCode != http.StatusOK:
		return nil, errdefs.Publicf("npm_packages: %q: %s: the npm registry answers %s: %w", spec, what, resp.Status, errdefs.ErrUnavailable)
	}
	d, err := decodePackument(resp.Body, maxPackumentBytes)
	if err != nil {
		return nil, errdefs.Publicf("npm_packages: %q: %s: the npm registry's document: %s: %w", spec, what, err.Error(), errdefs.ErrUnavailable)
	}
	if d.Name != name {
		return nil, errdefs.Publicf("npm_packages: %q: %s: the npm registry answers a document of %q: %w", spec, what, d.Name, errdefs.ErrUnavailable)
	}
	return d, nil
}

// next takes the queued package to resolve the dependencies of: the
// shallowest in the tree, then the first by path, as npm's arborist
// does, so that the same packages win the top-level places as with npm.
func (r *resolver) next() *node {
	best := 0
	for i, n := range r.queue[1:] {
		if before(n.path, r.queue[best].path) {
			best = i + 1
		}
	}
	n := r.queue[best]
	r.queue = append(r.queue[:best], r.queue[best+1:]...)
	return n
}

// before orders tree paths by depth, then by name.
func before(a, b string) bool {
	da, db := strings.Count(a, "/node_modules/"), strings.Count(b, "/node_modules/")
	if da != db {
		return da < db
	}
	la, lb := strings.ToLower(a), strings.ToLower(b)
	if la != lb {
		return la < lb
	}
	return a < b
}

// levels are the node_modules directories node resolution searches from
// the package at path, nearest first, as prefixes of paths: for
// "a/node_modules/b", "a/node_modules/b/node_modules/",
// "a/node_modules/", "". The template itself ("") searches "".
func levels(path string) []string {
	if path == "" {
		return []string{""}
	}
	out := []string{path + "/node_modules/"}
	for {
		i := strings.LastIndex(path, "/node_modules/")
		if i < 0 {
			break
		}
		path = path[:i]
		out = append(out, path+"/node_modules/")
	}
	return append(out, "")
}

// lookup finds what node resolution finds for name from the package at
// from: the index in levels(from) and the node, or len(levels) and nil.
func (r *resolver) lookup(from, name string) (int, *node) {
	ls := levels(from)
	for i, l := range ls {
		if n, ok := r.tree[l+name]; ok {
			return i, n
		}
	}
	return len(ls), nil
}

// canPlace reports whether name may be placed in the node_modules level:
// nothing of that name is there, and no dependency resolved so far would
// find it there instead of the package it found higher up.
func (r *resolver) canPlace(level, name string) bool {
	if _, taken := r.tree[level+name]; taken {
		return false
	}
	for _, e := range r.edges {
		if e.name != name {
			continue
		}
		ls := levels(e.from)
		at, to := -1, -1
		for i, l := range ls {
			if l == level {
				at = i
			}
			if l+name == e.to {
				to = i
			}
		}
		if at >= 0 && to > at {
			return false
		}
	}
	return true
}

// place puts name@v where node resolution from the package at from finds
// it, as high as it can go, and queues its dependencies.
func (r *resolver) place(spec, from, name string, v version) (*node, error) {
	doc := r.docs[name]
	m, err := doc.manifest(v)
	if err != nil {
		return nil, errdefs.Publicf("npm_packages: %q: %s@%s: %s: %w", spec, name, v, err.Error(), errdefs.ErrUnavailable)
	}
	if !m.platformOK() {
		return nil, errdefs.Publicf("npm_packages: %q: %s@%s is not for linux/x64/glibc (os %v, cpu %v, libc %v): %w", spec, name, v, m.OS, m.CPU, m.Libc, errdefs.ErrInvalidArgument)
	}
	ls := levels(from)
	nearest, _ := r.lookup(from, name)
	for i := min(nearest, len(ls)) - 1; i >= 0; i-- {
		if !r.canPlace(ls[i], name) {
			continue
		}
		if strings.Count(ls[i], "/node_modules/") >= maxDepth {
			return nil, errdefs.Publicf("npm_packages: %q: %s@%s would nest node_modules more than %d deep: %w", spec, name, v, maxDepth, errdefs.ErrResourceExhausted)
		}
		if len(r.tree) >= maxPackages {
			return nil, errdefs.Publicf("npm_packages: %q: more than %d packages: %w", spec, maxPackages, errdefs.ErrResourceExhausted)
		}
		n := &node{name: name, v: v, m: m, path: ls[i] + name, spec: spec}
		r.tree[n.path] = n
		r.edges = append(r.edges, edge{from, name, n.path})
		r.queue = append(r.queue, n)
		for dep, rng := range n.m.deps() {
			if validName(dep) {
				r.prefetch(dep, spec, fmt.Sprintf("%s@%s (needed by %s@%s)", dep, rng, n.name, n.v))
			}
		}
		return n, nil
	}
	return nil, errdefs.Publicf("npm_packages: %q: %s@%s cannot be placed in node_modules without hiding another version of it: %w", spec, name, v, errdefs.ErrFailedPrecondition)
}

// dependencies resolves a placed package's dependencies and optional
// dependencies, in name order.
func (r *resolver) dependencies(n *node) error {
	deps := n.m.deps()
	names := make([]string, 0, len(deps))
	for name := range deps {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		_, optional := n.m.Optional[name]
		err := r.dependency(n, name, deps[name])
		if err != nil && !optional {
			return err
		}
	}
	return nil
}

// dependency resolves one dependency of n.
func (r *resolver) dependency(n *node, name, spec string) error {
	what := fmt.Sprintf("%s@%s (needed by %s@%s)", name, spec, n.name, n.v)
	if !validName(name) {
		return errdefs.Publicf("npm_packages: %q: %s: %q is not an npm package name: %w", n.spec, what, name, errdefs.ErrInvalidArgument)
	}
	rng, tag, err := parseDepSpec(spec)
	if err != nil {
		return errdefs.Publicf("npm_packages: %q: %s: %s: %w", n.spec, what, err.Error(), errdefs.ErrInvalidArgument)
	}
	// What node resolution finds already, if it will do.
	if _, found := r.lookup(n.path, name); found != nil && tag == "" && rng.test(found.v) {
		r.edges = append(r.edges, edge{n.path, name, found.path})
		return nil
	}
	doc, err := r.doc(name, n.spec, what)
	if err != nil {
		return err
	}
	var v version
	if tag != "" {
		t, ok := doc.DistTags[tag]
		if !ok {
			return errdefs.Publicf("npm_packages: %q: %s: no dist-tag %q: %w", n.spec, what, tag, errdefs.ErrNotFound)
		}
		if v, err = parseVersion(t); err != nil {
			return errdefs.Publicf("npm_packages: %q: %s: dist-tag %q is not a version: %w", n.spec, what, tag, errdefs.ErrNotFound)
		}
		if _, found := r.lookup(n.path, name); found != nil && compare(found.v, v) == 0 {
			r.edges = append(r.edges, edge{n.path, name, found.path})
			return nil
		}
	} else {
		var ok bool
		if v, ok = doc.pick(rng); !ok {
			return errdefs.Publicf("npm_packages: %q: %s: no version matches: %w", n.spec, what, errdefs.ErrNotFound)
		}
	}
	_, err = r.place(n.spec, n.path, name, v)
	return err
}

// parseDepSpec reads a dependency's spec: a range, or a dist-tag.
func parseDepSpec(spec string) (semverRange, string, error) {
	s := strings.TrimSpace(spec)
	switch {
	case strings.HasPrefix(s, "npm:"):
		return nil, "", fmt.Errorf("aliases (npm:) are not supported")
	case strings.HasPrefix(s, "workspace:"), strings.HasPrefix(s, "file:"), strings.HasPrefix(s, "link:"):
		return nil, "", fmt.Errorf("local packages (%s) are not supported", s[:strings.IndexByte(s, ':')+1])
	case strings.Contains(s, "://") || strings.HasPrefix(s, "git") || strings.HasPrefix(s, "github:"):
		return nil, "", fmt.Errorf("packages from URLs or git repositories are not supported")
	case strings.Contains(s, "/") && !strings.ContainsAny(s, "<>=^~ "):
		return nil, "", fmt.Errorf("packages from git repositories (user/repo) are not supported")
	}
	if rng, err := parseRange(s); err == nil {
		return rng, "", nil
	}
	if tagPattern.MatchString(s) {
		return nil, s, nil
	}
	return nil, "", fmt.Errorf("%q is not a version range npm's grammar allows", spec)
}

// check verifies the tree: every resolved dependency is what node finds
// from its dependent, and every peer dependency is there, in range.
func (r *resolver) check() error {
	for _, e := range r.edges {
		if _, found := r.lookup(e.from, e.name); found == nil || found.path != e.to {
			return fmt.Errorf("npm: resolving: %s from %q no longer finds %s", e.name, e.from, e.to)
		}
	}
	paths := make([]string, 0, len(r.tree))
	for p := range r.tree {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		n := r.tree[p]
		names := make([]string, 0, len(n.m.Peer))
		for name := range n.m.Peer {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			spec := n.m.Peer[name]
			_, found := r.lookup(n.path, name)
			if found == nil {
				if n.m.PeerOptional[name] {
					continue
				}
				return errdefs.Publicf("npm_packages: %q: %s@%s needs the peer dependency %s@%s, which is not installed: add it to npm_packages: %w",
					n.spec, n.name, n.v, name, spec, errdefs.ErrFailedPrecondition)
			}
			if rng, err := parseRange(spec); err == nil && !rng.test(found.v) {
				return errdefs.Publicf("npm_packages: %q: %s@%s needs the peer dependency %s@%s, not %s@%s: %w",
					n.spec, n.name, n.v, name, spec, name, found.v, errdefs.ErrFailedPrecondition)
			}
		}
	}
	return nil
}
