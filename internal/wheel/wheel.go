// Package wheel fetches and installs pure-python wheels for templates
// (docs/design.md, "Templates") without pip: Fetch copies a wheel from the
// operator's wheelhouse directory or downloads it from a PEP 503 simple
// index, and checks the SHA-256 the declaration pins before anything reads
// it; Install unpacks it into an image's tree, never outside the
// directories a wheel may write (site-packages, /usr/local/bin and
// /usr/local), and writes the INSTALLER and RECORD files that pip would.
//
// Only pure-python wheels (py3-none-any, py2.py3-none-any) install: a
// wheel built for a platform carries compiled code for an interpreter and
// a C library the template's image may not have, so it is refused with
// the wheel's name.
//
//	path, err := wheel.Fetch(ctx, templates.Wheel{File: "attrs-23.2.0-py3-none-any.whl", SHA256: hex},
//		"/var/lib/stockade/wheelhouse", "", cacheDir)
//	inst, err := wheel.Install(path, tree, "/usr/local/lib/python3.13/dist-packages")
package wheel

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
)

// Installed is a wheel Install put into a tree.
type Installed struct {
	// Name and Version are the distribution's, from its METADATA (which
	// Install checks against the file name).
	Name, Version string
	// SHA256 is the hex SHA-256 of the wheel file.
	SHA256 string
	// File is the wheel's file name.
	File string
}

// Limits of what one wheel may hold. A wheel is pinned by its hash, but
// the operator may pin a wheel they have not read: Install bounds what it
// writes as it bounds any archive from outside.
const (
	// maxWheelBytes bounds a wheel file (Fetch's download and copy, and
	// Install's input).
	maxWheelBytes = 256 << 20
	// maxUnpackedBytes bounds the bytes a wheel unpacks to.
	maxUnpackedBytes = 1 << 30
	// maxEntries bounds the entries of a wheel's archive.
	maxEntries = 50000
	// maxMetaBytes bounds METADATA, WHEEL and entry_points.txt.
	maxMetaBytes = 1 << 20
	// maxRecordBytes bounds the wheel's RECORD.
	maxRecordBytes = 16 << 20
)

// fileName is a wheel's parsed file name (PEP 427):
// {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl.
type fileName struct {
	Dist, Version, Build, Python, ABI, Platform string
}

// distPart is a distribution or version part of a wheel's file name:
// escaped names have '_' for '-', and no part holds a '-'.
var distPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+!]*$`)

// parseFileName parses a wheel's file name; the error is public and names
// the file.
func parseFileName(name string) (fileName, error) {
	base, ok := strings.CutSuffix(name, ".whl")
	if !ok || name != path.Base(name) || strings.ContainsAny(name, `/\`) {
		return fileName{}, errdefs.Publicf("wheel %q: not a wheel file name (name-version-python-abi-platform.whl): %w", name, errdefs.ErrInvalidArgument)
	}
	parts := strings.Split(base, "-")
	var f fileName
	switch len(parts) {
	case 5:
		f = fileName{parts[0], parts[1], "", parts[2], parts[3], parts[4]}
	case 6:
		f = fileName{parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]}
	default:
		return fileName{}, errdefs.Publicf("wheel %q: not a wheel file name (name-version-python-abi-platform.whl): %w", name, errdefs.ErrInvalidArgument)
	}
	for _, p := range parts {
		if !distPart.MatchString(p) {
			return fileName{}, errdefs.Publicf("wheel %q: not a wheel file name (name-version-python-abi-platform.whl): %w", name, errdefs.ErrInvalidArgument)
		}
	}
	if f.Build != "" && (f.Build[0] < '0' || f.Build[0] > '9') {
		return fileName{}, errdefs.Publicf("wheel %q: build tag %q does not start with a digit: %w", name, f.Build, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// Pure reports whether the wheel runs on any python 3 of any platform:
// a python tag set holding py3 (py3, py2.py3), abi none, platform any.
func (f fileName) Pure() bool {
	py3 := false
	for _, t := range strings.Split(f.Python, ".") {
		if t == "py3" {
			py3 = true
		}
	}
	return py3 && f.ABI == "none" && f.Platform == "any"
}

// checkPure refuses a wheel built for a platform or an interpreter.
func (f fileName) checkPure(file string) error {
	if f.Pure() {
		return nil
	}
	return errdefs.Publicf("wheel %q is built for %s-%s-%s: only pure-python wheels (py3-none-any or py2.py3-none-any) install into a template: %w",
		file, f.Python, f.ABI, f.Platform, errdefs.ErrInvalidArgument)
}

var normRun = regexp.MustCompile(`[-_.]+`)

// normalize is a project name's PEP 503 normalized form, which names a
// project's page on a simple index and compares names.
func normalize(name string) string {
	return strings.ToLower(normRun.ReplaceAllString(name, "-"))
}

// projectName is PEP 508's distribution name.
var projectName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)

// versionText is what a pinned version may hold (PEP 440 public and local
// versions, and the legacy forms an index may carry).
var versionText = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+!_]*$`)

// parsePin parses a declaration's "project==version".
func parsePin(s string) (project, version string, err error) {
	project, version, ok := strings.Cut(s, "==")
	project, version = strings.TrimSpace(project), strings.TrimSpace(version)
	if !ok || !projectName.MatchString(project) || !versionText.MatchString(version) || len(s) > 200 {
		return "", "", errdefs.Publicf("python_wheels: %q: want \"project==version\" with an exact version: %w", s, errdefs.ErrInvalidArgument)
	}
	return project, version, nil
}

// sameVersion reports whether two spellings of a version are the same;
// versions are compared as written but for case, which PEP 440 ignores.
func sameVersion(a, b string) bool { return strings.EqualFold(a, b) }

// describe names a declared wheel in errors: its file, or its pin.
func describe(file, name string) string {
	if file != "" {
		return file
	}
	return name
}

// hashMismatch is the public error of a wheel whose hash is not the one
// declared.
func hashMismatch(what, got, want string) error {
	return errdefs.Publicf("python_wheels: %q: sha256 is %s, the declaration pins %s: %w", what, got, want, errdefs.ErrInvalidArgument)
}

func errorf(file, format string, args ...any) error {
	return errdefs.Publicf("wheel %q: %s: %w", file, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}
