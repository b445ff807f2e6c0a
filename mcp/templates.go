package mcp

import (
	"context"
	"fmt"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/client"
)

// TemplateBackend is what list_templates needs of Stockade: the
// templates, as GET /v1/templates lists them (*client.Client has it). The
// API lets admin and approver keys read templates; an agent key is
// refused, and the tool says so.
type TemplateBackend interface {
	Templates(ctx context.Context) ([]client.Template, error)
}

var _ TemplateBackend = (*client.Client)(nil)

// TemplateOutput is one template in list_templates' result.
type TemplateOutput struct {
	Name  string `json:"name" jsonschema:"the template's name"`
	Base  string `json:"base" jsonschema:"the image it adds to"`
	Built bool   `json:"built" jsonschema:"a build of it exists"`
	Stale bool   `json:"stale" jsonschema:"its build is of another declaration than the configured one, or there is none"`
}

// TemplatesOutput is list_templates' structured result.
type TemplatesOutput struct {
	Templates []TemplateOutput `json:"templates" jsonschema:"the daemon's templates"`
}

func addTemplateTools(s *sdk.Server, t *tools) bool {
	tb, ok := t.b.(TemplateBackend)
	if !ok {
		return false
	}
	sdk.AddTool(s, &sdk.Tool{
		Name:  "list_templates",
		Title: "List templates",
		Description: "Lists the daemon's templates (images with packages added to a base) and whether each is built. " +
			"Reading templates takes an admin or approver key; an agent key is refused.",
		Annotations: readOnly(),
	}, func(ctx context.Context, _ *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, TemplatesOutput, error) {
		list, err := tb.Templates(ctx)
		if err != nil {
			return nil, TemplatesOutput{}, failure(err)
		}
		out := TemplatesOutput{Templates: []TemplateOutput{}}
		var lines []string
		for _, tp := range list {
			out.Templates = append(out.Templates, TemplateOutput{Name: tp.Name, Base: tp.Base, Built: tp.Build != nil, Stale: tp.Stale})
			state := "built"
			switch {
			case tp.Build == nil:
				state = "not built"
			case tp.Stale:
				state = "built, stale"
			}
			lines = append(lines, fmt.Sprintf("%s (on %s): %s", tp.Name, tp.Base, state))
		}
		if len(lines) == 0 {
			lines = append(lines, "This daemon has no templates.")
		}
		return textResult(strings.Join(lines, "\n")), out, nil
	})
	return true
}
