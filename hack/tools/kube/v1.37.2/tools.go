//go:build tools

// Package tools pins the Kubernetes control-plane binaries (kube-apiserver,
// kube-controller-manager) that the tests build from the Go module proxy.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
