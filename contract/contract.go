// Package contract is the registry of capabilities Stockade can grant, as
// data: each capability has a name and a risk level, and the policy and
// approval layers decide on those, never on names.
//
//	c, ok := contract.Lookup("code.execute") // c.Risk == contract.RiskHigh
package contract

import "sort"

// Risk is how much harm a capability can do when abused.
type Risk string

// The risk levels, lowest first.
const (
	RiskLow    Risk = "low"
	RiskMedium Risk = "medium"
	RiskHigh   Risk = "high"
)

// Capability is one grantable operation.
type Capability struct {
	Name        string
	Risk        Risk
	Description string
}

// CodeExecute runs caller-supplied code in a sandbox: a remote code
// execution primitive by design, hence high risk.
var CodeExecute = Capability{
	Name:        "code.execute",
	Risk:        RiskHigh,
	Description: "run caller-supplied code (python, node, shell) in an isolated sandbox",
}

var registry = map[string]Capability{CodeExecute.Name: CodeExecute}

// Lookup returns the capability registered under name.
func Lookup(name string) (Capability, bool) {
	c, ok := registry[name]
	return c, ok
}

// All returns every registered capability, by name.
func All() []Capability {
	out := make([]Capability, 0, len(registry))
	for _, c := range registry {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
