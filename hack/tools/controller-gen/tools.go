//go:build tools

// Package tools pins controller-gen, built into bin/ by the Makefile.
package tools

import _ "sigs.k8s.io/controller-tools/cmd/controller-gen"
