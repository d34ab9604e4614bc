// Package bench holds benchmarks of the provider on a real control plane (envtest) with
// the IPAM-API stand-in: time from claim to bound IPAddress, one at a time and in
// bursts. Run them with `make bench`; they are not part of `make test`.
package bench
