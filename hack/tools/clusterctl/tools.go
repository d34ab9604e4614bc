//go:build tools

// Package tools pins clusterctl, built into bin/ by the Makefile.
package tools

import _ "sigs.k8s.io/cluster-api/cmd/clusterctl"
