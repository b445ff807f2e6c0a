// Package pb is the generated Go code of the subset of Modal's gRPC API
// the modal driver speaks (api.proto, task_command_router.proto: restated
// from Modal's Apache-2.0 definitions, see their heads).
package pb

//go:generate ./gen.sh
