//go:build tools

// Package tools pins syft's command for `go build` (coroner_dev.sbom).
package tools

import _ "github.com/anchore/syft/cmd/syft"
