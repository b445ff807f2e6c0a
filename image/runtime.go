package image

// Runtime is one language runtime Stockade can run code in: the image that
// carries it, the Debian packages the image is built from, and how the
// delivered file is run.
type Runtime struct {
	Name string
	// Packages are installed with debootstrap --include on top of minbase.
	// Packages[0] is the package whose version identifies the runtime in
	// listings.
	Packages []string
	// Interpreter is the argv that runs the delivered file; "{file}" is its path.
	Interpreter []string
	// FileName is the base name the code is delivered as under /tmp.
	FileName string
	// Strip are patterns (path.Match syntax, relative to the image root)
	// removed from the tree after debootstrap, so that package managers
	// cannot run inside the sandbox. Nil means nothing beyond the common
	// hardening.
	Strip []string
}

// Runtimes are the runtimes Stockade ships, by name.
var Runtimes = map[string]Runtime{
	// matplotlib draws the figures of the python kernel's cells (Agg: no
	// display, no GUI toolkit).
	"python": {
		Name:        "python",
		Packages:    []string{"python3", "python3-numpy", "python3-pandas", "python3-requests", "python3-matplotlib"},
		Interpreter: []string{"/usr/bin/python3", "{file}"},
		FileName:    "main.py",
		Strip: []string{
			"usr/lib/python3*/ensurepip",
			"usr/lib/python3*/site-packages/pip",
			"usr/lib/python3*/site-packages/pip-*",
			"usr/lib/python3/dist-packages/pip",
			"usr/lib/python3/dist-packages/pip-*",
			"usr/local/lib/python3*/dist-packages/pip",
			"usr/local/lib/python3*/dist-packages/pip-*",
			"usr/share/python-wheels",
			"usr/bin/pip",
			"usr/bin/pip3*",
			"usr/local/bin/pip*",
		},
	},
	"node": {
		Name:        "node",
		Packages:    []string{"nodejs", "ca-certificates"},
		Interpreter: []string{"/usr/bin/node", "{file}"},
		FileName:    "main.js",
		Strip: []string{
			"usr/bin/npm",
			"usr/bin/npx",
			"usr/bin/corepack",
			"usr/lib/node_modules/npm",
			"usr/lib/node_modules/corepack",
			"usr/share/nodejs/npm",
			"usr/share/nodejs/corepack",
			"usr/local/bin/npm",
			"usr/local/bin/npx",
			"usr/local/lib/node_modules",
		},
	},
	"shell": {
		Name:        "shell",
		Packages:    []string{"busybox"},
		Interpreter: []string{"/bin/busybox", "sh", "{file}"},
		FileName:    "main.sh",
	},
}

// runtimeNames are the names of Runtimes in the order they are built and
// listed.
var runtimeNames = []string{"python", "node", "shell"}

// Names returns the names of the runtimes Stockade ships, in build order.
func Names() []string { return append([]string(nil), runtimeNames...) }
