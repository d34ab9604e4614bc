// Command quickstart runs the provider on this machine with nothing but local
// processes, as `make quickstart` does: a control plane (etcd, kube-apiserver,
// kube-controller-manager) on loopback, the IPAM-API stand-in, `clusterctl init --ipam
// vitistack` from the locally built release, the Service webhook of the release's
// Services flavour, and the manager binary (both webhooks served on 127.0.0.1, the
// Service controller on), restarted when it dies unless --no-restart. It applies the
// example pools, claims and LoadBalancer Services from templates/, prints the claims,
// Services and pools (README.md shows this output; test/e2e compares the two) and a
// KUBECONFIG to explore with, and stops everything on Ctrl-C.
//
// `quickstart status` (make status) prints the same tables for the cluster of
// --kubeconfig or KUBECONFIG.
package main
