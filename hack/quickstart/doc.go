// Command quickstart runs the provider on this machine with nothing but local
// processes, as `make quickstart` does: a control plane (etcd, kube-apiserver,
// kube-controller-manager) on loopback, the IPAM-API stand-in, `VITISTACK_SERVICES=true
// clusterctl init --ipam vitistack` from the locally built release (the Service
// controller and its webhook on), and the manager binary with the installed Deployment's
// arguments (both webhooks served on 127.0.0.1), restarted when it dies unless
// --no-restart. It applies the
// example pools, claims and LoadBalancer Services from templates/, prints the claims,
// Services and pools (README.md shows this output; test/e2e compares the two) and a
// KUBECONFIG to explore with, and stops everything on Ctrl-C.
//
// With --node (make quickstart-node, as root) it runs the provider as a cluster does
// instead, on the node of test/node in network namespaces of its own: cert-manager,
// clusterctl init with the image in a Pod, MetalLB's speaker, and a LoadBalancer
// Service that a client host on the node's link reaches.
//
// `quickstart status` (make status) prints the same tables for the cluster of
// --kubeconfig or KUBECONFIG.
package main
