//go:build tools

// Package tools pins the CNI plugins the test node runs (bridge, host-local, loopback,
// portmap), built into bin/cni by the Makefile.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
