package templates

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/strictyaml"
)

// MaxFileSize bounds one templates file: a declaration is a few lines, and
// Start and Ready are each at most MaxCodeSize.
const MaxFileSize = 1 << 20

// Options are the host facts that validation checks declarations against.
// The daemon and `stockade template lint` pass the same Options.
type Options struct {
	// DataRoot is the only directory under which a template's files may
	// lie, after symlinks are resolved: the data root tools mount from,
	// refused as tools refuse it (internal/dataroot). Empty means no
	// template may have files.
	DataRoot string
}

// Problem is one reason a templates configuration is refused.
type Problem struct {
	// Source is "file:line" of the value at fault where known, or "file";
	// empty for a template built by hand.
	Source string
	// Template is the template's name; empty for problems of a file or of
	// a template without a name.
	Template string
	// Field is the key path of the value at fault, from the file's top
	// ("templates[0].python_wheels[1].sha256"); empty for the file itself.
	Field string
	// Message says what is wrong and, where it helps, how to fix it.
	Message string
}

// String renders the problem on one line:
//
//	templates.yaml:7: template "analytics": templates[0].python_wheels[1].sha256: want 64 hexadecimal digits
func (p Problem) String() string {
	var b strings.Builder
	if p.Source != "" {
		b.WriteString(p.Source + ": ")
	}
	if p.Template != "" {
		fmt.Fprintf(&b, "template %q: ", p.Template)
	}
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// Problems is every problem found in a configuration. As an error it reads
// one problem per line and is an ErrInvalidArgument.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

func (ps Problems) Unwrap() error { return errdefs.ErrInvalidArgument }

// Load reads the templates defined in path, a YAML file or a directory
// whose *.yaml files are read in name order (hidden files skipped, no
// recursion), validates them with opts and returns them. An empty path
// yields an empty Set.
//
// A configuration with any problem is refused whole: the error is then a
// Problems listing all of them. An error reading path wraps ErrNotFound or
// ErrInvalidArgument.
//
// A templates file is a mapping with one key, templates:
//
//	templates:
//	  - name: analytics
//	    base: python
//	    debian_packages: [python3-bs4]
//	    python_wheels:
//	      - {file: tabulate-0.9.0-py3-none-any.whl, sha256: 0123...}
//	    files:
//	      - {source: /var/lib/stockade/data/model.json, target: /opt/model.json}
//	    env: {MODEL: /opt/model.json}
//	    start: "import bs4"
//	    ready: "assert bs4.__version__"
func Load(path string, opts Options) (*Set, error) {
	if path == "" {
		return newSet(nil), nil
	}
	files, err := strictyaml.Files(path, "templates")
	if err != nil {
		return nil, err
	}
	var (
		ts []Template
		ps Problems
	)
	for _, f := range files {
		data, err := readBounded(f)
		if err != nil {
			return nil, err
		}
		fts, fps := Parse(f, data)
		ts = append(ts, fts...)
		ps = append(ps, fps...)
	}
	return finish(ts, ps, opts)
}

// LoadList is Load for a list of templates written in another YAML file
// (the templates: key of a configuration file): list is its sequence node,
// and problems name file and the lines of the list.
func LoadList(file string, list *yaml.Node, opts Options) (*Set, error) {
	top := &yaml.Node{Kind: yaml.MappingNode, Line: list.Line, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Tag: "!!str", Value: "templates", Line: list.Line}, list}}
	ts, ps := parseTop(file, top)
	return finish(ts, ps, opts)
}

func finish(ts []Template, ps Problems, opts Options) (*Set, error) {
	ps = append(ps, Validate(ts, opts)...)
	if len(ps) > 0 {
		sortProblems(ps)
		return nil, ps
	}
	return newSet(ts), nil
}

// readBounded reads a templates file of at most MaxFileSize bytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading templates file: %w", strictyaml.ClassifyFSError(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading templates file: %w", strictyaml.ClassifyFSError(err))
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("templates file %s is larger than %d bytes: %w", path, MaxFileSize, errdefs.ErrInvalidArgument)
	}
	return data, nil
}

// Parse decodes one templates file, named file in problems, and returns
// its templates, unvalidated, with the problems of the decoding itself:
// YAML syntax, unknown and repeated keys, values of the wrong form. Each
// problem names the key path and its line. Load runs Validate on the
// result.
func Parse(file string, data []byte) ([]Template, Problems) {
	top, line, msg := strictyaml.Document(data, "templates")
	if msg != "" {
		return nil, Problems{{Source: strictyaml.LineOf(file, line), Message: msg}}
	}
	if top == nil {
		return nil, nil
	}
	return parseTop(file, top)
}

var itemPathRE = regexp.MustCompile(`^templates\[(\d+)\]`)

// parseTop decodes the top-level mapping of a templates file.
func parseTop(file string, top *yaml.Node) ([]Template, Problems) {
	at := func(line int) string { return strictyaml.LineOf(file, line) }
	if top.Kind != yaml.MappingNode {
		return nil, Problems{{Source: at(top.Line),
			Message: `a templates file is a mapping with one key, "templates:", holding a list of templates`}}
	}
	items := templateItems(top)
	nameOf := func(path string) string {
		if m := itemPathRE.FindStringSubmatch(path); m != nil {
			if i, err := strconv.Atoi(m[1]); err == nil && i < len(items) {
				return items[i].name
			}
		}
		return ""
	}

	var ps Problems
	var f fileYAML
	for _, p := range strictyaml.Decode(top, &f) {
		ps = append(ps, Problem{Source: at(p.Line), Template: nameOf(p.Path), Field: p.Path, Message: p.Message})
	}
	ts := make([]Template, 0, len(f.Templates))
	for i, y := range f.Templates {
		var it item
		if i < len(items) {
			it = items[i]
		}
		t := y.template()
		t.Source = at(it.line)
		t.file, t.path, t.lines = file, fmt.Sprintf("templates[%d]", i), it.lines
		for _, d := range it.repeated {
			ps = append(ps, Problem{Source: at(d.line), Template: t.Name, Field: t.path + ".env",
				Message: fmt.Sprintf("key %q is given twice; keep one", d.key)})
		}
		ts = append(ts, t)
	}
	return ts, ps
}

// item is where one entry of the templates list is, and the line of each
// key path below it.
type item struct {
	line     int
	name     string
	lines    map[string]int // "python_wheels[1].sha256" -> line
	repeated []repeatedKey  // env keys given twice
}

type repeatedKey struct {
	line int
	key  string
}

// templateItems returns the position, name and key lines of each entry of
// the templates list of the top-level mapping top.
func templateItems(top *yaml.Node) []item {
	var items []item
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "templates" || top.Content[i+1].Kind != yaml.SequenceNode {
			continue
		}
		for _, n := range top.Content[i+1].Content {
			it := item{line: n.Line, lines: map[string]int{}}
			if n.Kind == yaml.MappingNode {
				for j := 0; j+1 < len(n.Content); j += 2 {
					k, v := n.Content[j], n.Content[j+1]
					switch k.Value {
					case "name":
						if v.Kind == yaml.ScalarNode {
							it.name = v.Value
						}
					case "env":
						seen := map[string]bool{}
						for e := 0; v.Kind == yaml.MappingNode && e+1 < len(v.Content); e += 2 {
							if key := v.Content[e]; seen[key.Value] {
								it.repeated = append(it.repeated, repeatedKey{key.Line, key.Value})
							} else {
								seen[key.Value] = true
							}
						}
					}
					recordLines(it.lines, k.Value, k.Line, v, 0)
				}
			}
			items = append(items, it)
		}
	}
	return items
}

// recordLines notes the line of path, whose key is at keyLine and whose
// value is v, and of every key path below it. Depth is bounded: a
// declaration nests three levels at most.
func recordLines(lines map[string]int, path string, keyLine int, v *yaml.Node, depth int) {
	if _, ok := lines[path]; !ok {
		lines[path] = keyLine
	}
	if depth > 3 {
		return
	}
	switch v.Kind {
	case yaml.SequenceNode:
		for i, e := range v.Content {
			recordLines(lines, fmt.Sprintf("%s[%d]", path, i), e.Line, e, depth+1)
		}
	case yaml.MappingNode:
		for j := 0; j+1 < len(v.Content); j += 2 {
			recordLines(lines, path+"."+v.Content[j].Value, v.Content[j].Line, v.Content[j+1], depth+1)
		}
	}
}

// sortProblems orders problems by file and line, keeping the order of
// problems at the same place; problems without a place come first.
func sortProblems(ps Problems) {
	key := func(p Problem) (string, int) {
		i := strings.LastIndexByte(p.Source, ':')
		if i < 0 {
			return p.Source, 0
		}
		n, err := strconv.Atoi(p.Source[i+1:])
		if err != nil {
			return p.Source, 0
		}
		return p.Source[:i], n
	}
	sort.SliceStable(ps, func(i, j int) bool {
		fi, li := key(ps[i])
		fj, lj := key(ps[j])
		if fi != fj {
			return fi < fj
		}
		return li < lj
	})
}

// The YAML shapes.
type fileYAML struct {
	Templates []templateYAML `yaml:"templates"`
}

type templateYAML struct {
	Name           string            `yaml:"name"`
	Base           string            `yaml:"base"`
	DebianPackages []string          `yaml:"debian_packages"`
	NPMPackages    []string          `yaml:"npm_packages"`
	NPMScripts     bool              `yaml:"npm_scripts"`
	PythonWheels   []wheelYAML       `yaml:"python_wheels"`
	Files          []fileEntryYAML   `yaml:"files"`
	Env            map[string]string `yaml:"env"`
	Workdir        string            `yaml:"workdir"`
	Start          string            `yaml:"start"`
	Ready          string            `yaml:"ready"`
	Golden         bool              `yaml:"golden"`
}

type wheelYAML struct {
	File   string `yaml:"file"`
	Name   string `yaml:"name"`
	SHA256 string `yaml:"sha256"`
}

type fileEntryYAML struct {
	Source string `yaml:"source"`
	Target string `yaml:"target"`
}

func (y templateYAML) template() Template {
	t := Template{
		Name:           y.Name,
		Base:           y.Base,
		DebianPackages: y.DebianPackages,
		NPMPackages:    y.NPMPackages,
		NPMScripts:     y.NPMScripts,
		Env:            y.Env,
		Workdir:        y.Workdir,
		Start:          y.Start,
		Ready:          y.Ready,
		Golden:         y.Golden,
	}
	for _, w := range y.PythonWheels {
		t.PythonWheels = append(t.PythonWheels, Wheel(w))
	}
	for _, f := range y.Files {
		t.Files = append(t.Files, File(f))
	}
	return t
}
