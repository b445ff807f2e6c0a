package registry

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"github.com/stockade-sh/stockade/errdefs"
)

// Descriptor is a content descriptor of a manifest.
type Descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// maxLayers bounds the layers of a manifest ParseManifest accepts.
const maxLayers = 256

// ParseManifest decodes an OCI image manifest a registry sent (at most
// MaxManifestSize bytes), checking its schema version, media type and
// descriptors.
func ParseManifest(data []byte) (Manifest, error) {
	bad := func(format string, a ...any) (Manifest, error) {
		return Manifest{}, fmt.Errorf("registry manifest: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrUnavailable)
	}
	if len(data) > MaxManifestSize {
		return bad("over %d bytes", MaxManifestSize)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return bad("%v", err)
	}
	if m.SchemaVersion != 2 {
		return bad("schema version %d, want 2", m.SchemaVersion)
	}
	if m.MediaType != "" && m.MediaType != MediaTypeManifest {
		return bad("media type %q, want %s", m.MediaType, MediaTypeManifest)
	}
	if len(m.Layers) > maxLayers {
		return bad("%d layers, more than %d", len(m.Layers), maxLayers)
	}
	for _, d := range append([]Descriptor{m.Config}, m.Layers...) {
		if !digestPattern.MatchString(d.Digest) || d.Size < 0 {
			return bad("descriptor %q of size %d", d.Digest, d.Size)
		}
	}
	return m, nil
}

// maxErrors bounds the messages ParseErrors returns.
const maxErrors = 8

// ParseErrors returns the messages of a registry's error body
// ({"errors": [{"code": ..., "message": ...}]}), at most maxErrors of
// them, each cut to 200 bytes and stripped of unprintable characters; none
// if the body is not one.
func ParseErrors(body []byte) []string {
	var e struct {
		Errors []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if len(body) > maxErrorBody || json.Unmarshal(body, &e) != nil {
		return nil
	}
	var out []string
	for i, x := range e.Errors {
		if i == maxErrors {
			break
		}
		s := x.Code
		if x.Message != "" {
			s += " " + x.Message
		}
		out = append(out, clean(strings.TrimSpace(s)))
	}
	return out
}

// clean cuts s to 200 bytes (on a rune boundary) and replaces what is
// not printable (control characters, bidi and other format characters,
// line separators), so that a registry's message can neither forge
// lines nor reorder what a terminal shows.
func clean(s string) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= 200 {
			break
		}
		if !unicode.IsPrint(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String()
}
