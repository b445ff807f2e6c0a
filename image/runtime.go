package image

// Runtime is one language runtime Stockade can run code in: the image that
// carries it, the Debian packages the image is built from, and how the
// delivered file is run.
type Runtime struct {
	Name string
	// Packages are installed with debootstrap --include on top of minbase.
	Packages []string
	// Interpreter is the argv that runs the delivered file; "{file}" is its path.
	Interpreter []string
	// FileName is the base name the code is delivered as under /tmp.
	FileName string
}

// Runtimes are the runtimes Stockade ships, by name.
var Runtimes = map[string]Runtime{
	"python": {
		Name:        "python",
		Packages:    []string{"python3", "python3-numpy", "python3-pandas", "python3-requests"},
		Interpreter: []string{"/usr/bin/python3", "{file}"},
		FileName:    "main.py",
	},
	"node": {
		Name:        "node",
		Packages:    []string{"nodejs"},
		Interpreter: []string{"/usr/bin/node", "{file}"},
		FileName:    "main.js",
	},
	"shell": {
		Name:        "shell",
		Packages:    []string{"busybox"},
		Interpreter: []string{"/bin/busybox", "sh", "{file}"},
		FileName:    "main.sh",
	},
}
