//go:build tools

// Package tools pins kustomize, built into bin/ by the Makefile.
package tools

import _ "sigs.k8s.io/kustomize/kustomize/v5"
