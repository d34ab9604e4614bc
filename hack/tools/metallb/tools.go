//go:build tools

// Package tools pins MetalLB's controller, built into bin/metallb-controller by the
// Makefile for the end-to-end tests and the quickstart, with its CRDs (copied into
// bin/metallb-crds), and its speaker, which the node's tests run as a Pod. v0.15.2, not v0.16.2: v0.16.2 needs github.com/metallb/frr-k8s
// v0.0.27, which the Go module proxy does not serve.
package tools

import (
	_ "go.universe.tf/metallb/controller"
	_ "go.universe.tf/metallb/speaker"
)
