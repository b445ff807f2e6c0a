// Command override shows that a resolver override is refused outside test
// binaries; egress's tests run it.
package main

import (
	"fmt"
	"os"

	"github.com/stockade-sh/stockade/egress"
)

func main() {
	_, err := egress.New(egress.Config{TestOverride: &egress.TestOverride{}})
	if err == nil {
		fmt.Println("accepted")
		os.Exit(1)
	}
	fmt.Println("refused:", err)
}
