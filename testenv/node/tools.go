//go:build tools

// Package tools pins the node's runtime commands this module builds (containerd, its runc shim,
// ctr and crictl), so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
