package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/stockade-sh/stockade/errdefs"
)

// Files returns path itself when it is a file, or the *.yaml files of the
// directory path in name order (hidden files skipped, no recursion): the
// files a configuration of what (tools, templates) is read from. An error
// wraps errdefs.ErrNotFound or errdefs.ErrInvalidArgument.
func Files(path, what string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, ClassifyFSError(err))
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s directory: %w", what, ClassifyFSError(err))
	}
	var files []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ".yaml") || e.IsDir() {
			continue
		}
		files = append(files, filepath.Join(path, n))
	}
	return files, nil // os.ReadDir sorts by name
}

// ClassifyFSError classes an error reading a configuration file: a missing
// file is ErrNotFound, anything else ErrInvalidArgument.
func ClassifyFSError(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
}

// Document decodes data, a file that holds one YAML document of what
// (tools, templates), and returns its top node: nil, with no problem,
// for an empty file. A syntax error or a second document is returned as
// the line it is on (0 when unknown) and its message.
func Document(data []byte, what string) (top *yaml.Node, line int, problem string) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, 0, "" // an empty file defines nothing
		}
		line, msg := splitLine(strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, line, msg
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, extra.Line, fmt.Sprintf("a %s file holds one YAML document; split the others into their own files", what)
	}
	if len(doc.Content) == 0 {
		return nil, 0, ""
	}
	return doc.Content[0], 0, ""
}

// LineOf is "file:line", or file when the line is not known (0).
func LineOf(file string, line int) string {
	if line <= 0 {
		return file
	}
	return file + ":" + strconv.Itoa(line)
}

var lineRE = regexp.MustCompile(`^line (\d+): (.*)$`)

// splitLine splits the YAML decoder's "line N: message" into N and message.
func splitLine(s string) (int, string) {
	m := lineRE.FindStringSubmatch(s)
	if m == nil {
		return 0, s
	}
	n, _ := strconv.Atoi(m[1])
	return n, m[2]
}
