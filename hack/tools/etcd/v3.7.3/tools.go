//go:build tools

// Package tools pins etcd, built into bin/ by the Makefile.
package tools

import _ "go.etcd.io/etcd/server/v3"
