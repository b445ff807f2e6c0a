package image

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// installedPackages parses a dpkg status database and returns the version of
// every installed package by name. A package installed for more than one
// architecture is keyed "name:arch" for each.
func installedPackages(status []byte) (map[string]string, error) {
	type pkg struct{ name, arch, version, status string }
	var all []pkg
	var cur pkg
	flush := func() {
		if cur.name != "" && strings.HasSuffix(cur.status, " installed") {
			all = append(all, cur)
		}
		cur = pkg{}
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue // continuation of a multi-line field
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Package":
			cur.name = v
		case "Architecture":
			cur.arch = v
		case "Version":
			cur.version = v
		case "Status":
			cur.status = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parsing dpkg status: %w", err)
	}
	flush()
	count := make(map[string]int)
	for _, p := range all {
		count[p.name]++
	}
	out := make(map[string]string, len(all))
	for _, p := range all {
		key := p.name
		if count[p.name] > 1 {
			key += ":" + p.arch
		}
		out[key] = p.version
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("parsing dpkg status: no installed package")
	}
	return out, nil
}
