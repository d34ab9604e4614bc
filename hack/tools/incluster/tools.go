//go:build tools

// Package tools pins the Cluster API in-cluster IPAM provider, built into
// bin/ipam-incluster by the Makefile for `make bench-compare` (test/bench/compare).
package tools

import _ "sigs.k8s.io/cluster-api-ipam-provider-in-cluster"
