//go:build tools

// Package tools pins the commands this module builds, so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "helm.sh/helm/v4/cmd/helm"
)
