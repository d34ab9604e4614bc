// Command quickstart runs the provider on this machine with nothing but local
// processes, as `make quickstart` does: a control plane (etcd, kube-apiserver,
// kube-controller-manager) on loopback, the IPAM-API stand-in, `clusterctl init --ipam
// vitistack` from the locally built release, and the manager binary (webhooks served on
// 127.0.0.1, the Service controller on). It applies the example pools, claims and
// LoadBalancer Services from templates/, prints what was allocated and a KUBECONFIG to
// explore with, and stops everything on Ctrl-C.
package main
