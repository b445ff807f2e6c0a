#!/bin/sh
# Generates the Go code of the subset of Modal's API in this directory:
# protoc from Debian's protobuf-compiler (3.21), and the plugins
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
# on PATH. Run by `go generate ./driver/modal/...`.
set -eu
cd "$(dirname "$0")"
protoc --proto_path=. \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	api.proto task_command_router.proto
