//go:build tools

// Package tools pins Prometheus: promtool unit-tests the alert rules in
// config/observability, and the server scrapes a manager in the end-to-end tests. Both
// are built into bin/ by the Makefile.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
