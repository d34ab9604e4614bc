//go:build tools

// Package tools pins promtool, built into bin/ by the Makefile to unit-test the alert
// rules in config/observability.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
