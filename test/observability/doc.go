// Package observability tests the alert rules in config/observability with promtool
// (built from the Prometheus module into bin/ by make).
package observability
