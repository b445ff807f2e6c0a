//go:build !amd64 && !arm64

package main

// The guest's signal handler is written in assembly for amd64 and arm64
// only (signals_*.s): another architecture needs a file of its own.
var _ = sigDropIsWrittenForAmd64AndArm64Only
