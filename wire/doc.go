// Package wire declares Stockade's HTTP API once: the request and response
// bodies, the events of an execution's stream and the error answer with
// its stable codes. The server (api), the Go client (client), the MCP
// server (mcp) and the console all use these types, so that what one
// encodes is what the others decode, as k8s.io/api serves the apiserver
// and client-go alike. api/openapi.json describes the same types; a test
// (api/openapi_test.go) checks that each names the same fields.
//
// The package imports nothing of Stockade's: it is data.
//
//	var ex wire.Execution
//	_ = json.Unmarshal(body, &ex)
//	if ex.Status.Final() && ex.Result != nil { fmt.Print(ex.Result.Stdout) }
package wire
