//go:build tools

// Package tools pins runc, which this module builds with cgo and libseccomp (a module of its own:
// it is the one cgo build, and its pins never move containerd's).
package tools

import (
	_ "github.com/opencontainers/runc"
)
