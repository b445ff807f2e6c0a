package engine

import (
	"os"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/image"
)

// TestReadmeSaysWhatTheProgramGets checks the README's account of the
// program's environment and command line against the code that makes
// them: it said "an empty environment" while the program got PATH.
func TestReadmeSaysWhatTheProgramGets(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ") // line breaks do not matter
	py := image.Runtimes["python"]
	want := []string{
		"an environment of exactly `" + strings.Join(ProgramEnv(), "`, `") + "`",
		"`" + strings.ReplaceAll(strings.Join(py.Interpreter, " "), "{file}", "/tmp/"+py.FileName) + "`",
	}
	for _, name := range image.Names() {
		want = append(want, image.Runtimes[name].FileName)
	}
	for _, w := range want {
		if !strings.Contains(readme, w) {
			t.Errorf("README does not say %s", w)
		}
	}
	if strings.Contains(readme, "an empty environment") {
		t.Errorf("README says the program gets an empty environment; it gets %v", ProgramEnv())
	}
}
