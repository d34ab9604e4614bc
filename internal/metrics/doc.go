// Package metrics defines the provider's own Prometheus metrics, all named
// vitistack_ipam_*, on controller-runtime's registry (served on the manager's
// diagnostics endpoint): the IPAM-API requests as they are sent, and, computed from the
// manager's cache at each scrape while it leads, its pools and claims. No label carries
// a secret, a claim's name or another unbounded value. docs/metrics.md lists them.
package metrics
