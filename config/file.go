package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/strictyaml"
	"github.com/stockade-sh/stockade/sandbox"
	"go.yaml.in/yaml/v3"
)

// ByteSize is a size in bytes, written in the file and on the command
// line as sandbox.ParseSize reads it (256MiB, 1g).
type ByteSize int64

func (s *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	var v size
	if err := v.UnmarshalYAML(n); err != nil {
		return err
	}
	*s = ByteSize(v)
	return nil
}

func (*ByteSize) YAMLForm() string { return (*size)(nil).YAMLForm() }

// Set implements flag.Value.
func (s *ByteSize) Set(v string) error {
	n, err := sandbox.ParseSize(v)
	if err != nil {
		return err
	}
	*s = ByteSize(n)
	return nil
}

func (s *ByteSize) String() string {
	if s == nil {
		return "0"
	}
	return sandbox.FormatSize(int64(*s))
}

// limitsFile is the YAML form of sandbox.Limits; a key left out keeps the
// value in force.
type limitsFile struct {
	Memory    *size          `yaml:"memory"`
	CPU       *float64       `yaml:"cpu"`
	Pids      *int64         `yaml:"pids"`
	Timeout   *time.Duration `yaml:"timeout"`
	TmpSize   *size          `yaml:"tmp_size"`
	OutputCap *size          `yaml:"output_cap"`
}

func (f limitsFile) apply(l *sandbox.Limits) {
	set := func(dst *int64, v *size) {
		if v != nil {
			*dst = int64(*v)
		}
	}
	set(&l.Memory, f.Memory)
	set(&l.TmpSize, f.TmpSize)
	set(&l.OutputCap, f.OutputCap)
	if f.CPU != nil {
		l.CPU = *f.CPU
	}
	if f.Pids != nil {
		l.Pids = *f.Pids
	}
	if f.Timeout != nil {
		l.Timeout = *f.Timeout
	}
}

// size is a byte size in the file, read with sandbox.ParseSize.
type size int64

func (s *size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("want %s, got a %s", s.YAMLForm(), kindWord(n))
	}
	v, err := sandbox.ParseSize(n.Value)
	if err != nil {
		return err
	}
	*s = size(v)
	return nil
}

func (*size) YAMLForm() string { return "a size such as 512MiB, 1GiB or 64m" }

func kindWord(n *yaml.Node) string {
	if n.Kind == yaml.SequenceNode {
		return "list"
	}
	return "mapping"
}

// fileForm is the YAML form of a configuration file: Config's keys, with
// the limits and the tools in their file forms.
type fileForm struct {
	*Config      `yaml:",inline"`
	Defaults     limitsFile `yaml:"defaults"`
	Ceiling      limitsFile `yaml:"ceiling"`
	Tools        pathOrList `yaml:"tools"`
	Templates    pathOrList `yaml:"templates"`
	MemoryBudget *size      `yaml:"memory_budget"`
}

// FileKeys returns the top-level keys of a configuration file.
func FileKeys() []string { return strictyaml.Keys(reflect.TypeFor[fileForm]()) }

// LoadFile applies a YAML configuration file on top of c. Unknown keys are
// refused, so that a typo never silently keeps a default; every problem of
// the file is reported, each naming its line, its key path and the form
// the key takes.
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("reading config: %w: %w", err, errdefs.ErrNotFound)
		}
		return fmt.Errorf("reading config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		where := path
		if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
			where, msg = path+":"+m[1], m[2]
		}
		return fmt.Errorf("config %s: %s: %w", where, msg, errdefs.ErrInvalidArgument)
	}
	file := fileForm{Config: c,
		Tools:     pathOrList{form: "the path of a tools file or directory, or a list of tools"},
		Templates: pathOrList{form: "the path of a templates file or directory, or a list of templates"}}
	if ps := strictyaml.Decode(&doc, &file); len(ps) > 0 {
		errs := make([]error, len(ps))
		for i, p := range ps {
			msg := p.Error()
			if p.Path == "" && p.Kind == strictyaml.BadValue {
				msg = "a configuration file is a mapping of keys such as listen: and data_dir:"
			}
			errs[i] = fmt.Errorf("config %s:%d: %s: %w", path, p.Line, msg, errdefs.ErrInvalidArgument)
		}
		return errors.Join(errs...)
	}
	file.Defaults.apply(&c.Defaults)
	file.Ceiling.apply(&c.Ceiling)
	if file.MemoryBudget != nil {
		c.MemoryBudget = int64(*file.MemoryBudget)
	}
	switch {
	case file.Tools.list != nil:
		c.Tools, c.ToolsList = "", &ToolsList{File: path, Node: file.Tools.list}
	case file.Tools.path != "":
		c.SetTools(relativeTo(path, file.Tools.path))
	}
	switch {
	case file.Templates.list != nil:
		c.Templates, c.TemplatesList = "", &TemplatesList{File: path, Node: file.Templates.list}
	case file.Templates.path != "":
		c.SetTemplates(relativeTo(path, file.Templates.path))
	}
	return nil
}

var yamlLineRE = regexp.MustCompile(`^line (\d+): (.*)$`)
