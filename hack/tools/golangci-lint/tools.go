//go:build tools

// Package tools pins golangci-lint, built into bin/ by the Makefile.
package tools

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
