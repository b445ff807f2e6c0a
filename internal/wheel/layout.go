package wheel

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The directories outside site-packages a wheel's .data/ schemes write to,
// relative to the tree's root: pip's for a /usr/local prefix.
const (
	scriptsDir = "usr/local/bin"
	dataDir    = "usr/local"
)

// kind is what an entry of a wheel is once installed.
type kind int

const (
	library kind = iota // a file of site-packages
	script              // a file of /usr/local/bin: 0755, shebang rewritten
	data                // a file under /usr/local
	skipped             // the wheel's own RECORD and signatures, replaced by ours
)

// entryPath checks an archive entry's name and returns its elements. A
// name that could reach outside the directory it is unpacked into
// (absolute, "..", a backslash, an empty or "." element) is refused.
func entryPath(file, name string) ([]string, error) {
	if name == "" || len(name) > 1024 || !utf8.ValidString(name) || strings.ContainsAny(name, "\x00\\") {
		return nil, errorf(file, "entry %q has a name that cannot be installed", name)
	}
	if strings.HasPrefix(name, "/") {
		return nil, errorf(file, "entry %q is an absolute path", name)
	}
	elems := strings.Split(strings.TrimSuffix(name, "/"), "/")
	for _, e := range elems {
		switch e {
		case "..":
			return nil, errorf(file, "entry %q points outside the wheel (..)", name)
		case "", ".":
			return nil, errorf(file, "entry %q has an empty or \".\" element", name)
		}
	}
	return elems, nil
}

// target maps an entry's elements to where it installs, relative to the
// tree's root: site-packages (sp, relative) for the library, and for
// {name}-{version}.data/ (dataStem) purelib and platlib to site-packages,
// scripts to /usr/local/bin, data to /usr/local. Headers are refused: a
// pure-python wheel has no use for C headers, and where pip puts them
// depends on the interpreter's version. An empty rel means "nothing to
// install" (the .data directory itself).
func target(file string, elems []string, sp, dataStem string, dir bool) (rel string, k kind, err error) {
	if elems[0] != dataStem {
		return path.Join(sp, path.Join(elems...)), library, nil
	}
	if len(elems) == 1 {
		return "", skipped, nil
	}
	rest := elems[2:]
	switch elems[1] {
	case "purelib", "platlib":
		if len(rest) == 0 {
			return "", skipped, nil
		}
		return path.Join(sp, path.Join(rest...)), library, nil
	case "scripts":
		if len(rest) == 0 {
			return "", skipped, nil
		}
		if len(rest) > 1 || dir {
			return "", 0, errorf(file, "entry %q: scripts must be files directly in %s/scripts", path.Join(elems...), dataStem)
		}
		return path.Join(scriptsDir, rest[0]), script, nil
	case "data":
		if len(rest) == 0 {
			return "", skipped, nil
		}
		return path.Join(dataDir, path.Join(rest...)), data, nil
	case "headers":
		return "", 0, errorf(file, "entry %q: C headers (.data/headers) are not installed into templates", path.Join(elems...))
	default:
		return "", 0, errorf(file, "entry %q: unknown .data scheme %q (want purelib, platlib, scripts or data)", path.Join(elems...), elems[1])
	}
}

// readHeaders parses the RFC 822 style headers of METADATA and WHEEL: the
// first value of each key (keys compared case-insensitively), up to the
// first empty line.
func readHeaders(r io.Reader) (map[string]string, error) {
	h := make(map[string]string)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxMetaBytes)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue // a value's continuation: only first lines are read
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return nil, errors.New("a header line without a colon")
		}
		k = strings.ToLower(strings.TrimSpace(k))
		if _, seen := h[k]; !seen {
			h[k] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

// recordEntry is one line of a RECORD: the file's hash ("sha256=..." in
// urlsafe base64 without padding) and size, both optional.
type recordEntry struct {
	Hash string
	Size int64
}

// readRecord parses a wheel's RECORD (CSV: path, hash, size).
func readRecord(r io.Reader) (map[string]recordEntry, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	rec := make(map[string]recordEntry)
	for {
		row, err := cr.Read()
		if err == io.EOF {
			return rec, nil
		}
		if err != nil {
			return nil, err
		}
		if len(row) == 0 || row[0] == "" {
			continue
		}
		if len(row) > 3 {
			return nil, errors.New("a line with more than three fields")
		}
		e := recordEntry{Size: -1}
		if len(row) > 1 {
			e.Hash = row[1]
		}
		if len(row) > 2 && row[2] != "" {
			n, err := strconv.ParseInt(row[2], 10, 64)
			if err != nil || n < 0 {
				return nil, errors.New("a size that is not a number")
			}
			e.Size = n
		}
		if len(rec) >= maxEntries {
			return nil, errors.New("too many lines")
		}
		rec[row[0]] = e
	}
}

// recordHash is a digest in RECORD's form.
func recordHash(algo string, sum []byte) string {
	return algo + "=" + base64.RawURLEncoding.EncodeToString(sum)
}

// shebang is a script's "#!python" line as a wheel ships it (PEP 427),
// with anything the interpreter's name is followed by (pythonw, python3).
var shebang = regexp.MustCompile(`^#!python[^\s]*`)

// rewriteShebang replaces a script's "#!python" with the image's python;
// a script without one is copied as it is.
func rewriteShebang(r io.Reader) io.Reader {
	br := bufio.NewReaderSize(r, 512)
	head, _ := br.Peek(512)
	loc := shebang.FindIndex(head)
	if loc == nil {
		return br
	}
	if _, err := br.Discard(loc[1]); err != nil {
		return br
	}
	return io.MultiReader(bytes.NewReader([]byte("#!/usr/bin/python3")), br)
}

// consoleScript is one entry of entry_points.txt's [console_scripts] or
// [gui_scripts]: a command calling module:attr.
type consoleScript struct {
	Name, Module, Attr string
}

var (
	scriptName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)
	dotted     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
)

// readEntryPoints parses entry_points.txt's console and gui scripts.
func readEntryPoints(file string, r io.Reader) ([]consoleScript, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxMetaBytes)
	section := ""
	var out []consoleScript
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' && line[len(line)-1] == ']' {
			section = strings.TrimSpace(line[1 : len(line)-1])
			continue
		}
		if section != "console_scripts" && section != "gui_scripts" {
			continue
		}
		name, ref, ok := strings.Cut(line, "=")
		name, ref = strings.TrimSpace(name), strings.TrimSpace(ref)
		if i := strings.IndexByte(ref, '['); i >= 0 {
			ref = strings.TrimSpace(ref[:i]) // extras do not change the command
		}
		mod, attr, _ := strings.Cut(ref, ":")
		mod, attr = strings.TrimSpace(mod), strings.TrimSpace(attr)
		if !ok || !scriptName.MatchString(name) || !dotted.MatchString(mod) || (attr != "" && !dotted.MatchString(attr)) {
			return nil, errorf(file, "entry_points.txt: cannot make a command of %q", line)
		}
		if len(out) >= 1000 {
			return nil, errorf(file, "entry_points.txt: too many commands")
		}
		out = append(out, consoleScript{name, mod, attr})
	}
	if err := sc.Err(); err != nil {
		return nil, errorf(file, "reading entry_points.txt: %s", err.Error())
	}
	return out, nil
}

// text is the wrapper pip writes for a console script.
func (c consoleScript) text() []byte {
	var b strings.Builder
	b.WriteString("#!/usr/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n")
	call := c.Module
	if c.Attr == "" {
		b.WriteString("import " + c.Module + "\n")
	} else {
		head, _, _ := strings.Cut(c.Attr, ".")
		b.WriteString("from " + c.Module + " import " + head + "\n")
		call = c.Attr
	}
	b.WriteString("if __name__ == \"__main__\":\n")
	b.WriteString("    sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n")
	b.WriteString("    sys.exit(" + call + "())\n")
	return []byte(b.String())
}
