// Package python holds the python programs that the kernel and sessions
// benchmarks time, so that their tables measure the same code, and the
// bare interpreter they are compared with.
package python

import "github.com/stockade-sh/stockade/bench/internal/table"

const (
	// Print is the smallest cell; it prints PrintOut.
	Print    = "print(1)"
	PrintOut = "1\n"
	// PandasCell uses pandas, which PandasImport, run as an earlier cell
	// of the same kernel, imported; it prints PandasOut. PandasOneShot is
	// the two as one program.
	PandasImport  = "import pandas as pd"
	PandasCell    = "print(int(pd.DataFrame({'a': [1, 2, 3]})['a'].sum()))"
	PandasOut     = "6\n"
	PandasOneShot = PandasImport + "\n" + PandasCell
)

// Bare returns a Run of the image's interpreter on code with no sandbox:
// `chroot rootfs /usr/bin/python3 -c code`, which must print want.
func Bare(rootfs, code, want string) func() error {
	return table.Command(want, nil, "chroot", rootfs, "/usr/bin/python3", "-c", code)
}
