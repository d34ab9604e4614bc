//go:build tools

// Package tools pins the Kubernetes binaries that the tests build from the Go module
// proxy: the control plane (kube-apiserver, kube-controller-manager) and kubectl, and the
// node's kube-scheduler, kubelet and kube-proxy, all of the same version.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
