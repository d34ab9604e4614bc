// Package localcluster runs the provider the way a user meets it, with local processes
// only: a control plane (etcd, kube-apiserver, kube-controller-manager) on loopback,
// `clusterctl init --ipam vitistack` from the offline repository that
// `make local-repository` writes, the IPAM-API stand-in, and the manager binary with the
// arguments and the ServiceAccount (impersonated, so RBAC is real) of the Deployment
// that clusterctl installed, serving its webhooks on 127.0.0.1.
//
// The node suite (test/node) runs a node too: containerd, the kubelet and kube-proxy,
// with the control plane and the stand-in, inside network namespaces it makes itself
// (RunInNodeNamespace, StartNodeControlPlane, StartNode).
//
// The quickstart (hack/quickstart) and the end-to-end tests (test/e2e) use it; `make
// e2e-assets` builds everything it runs and exports the paths (see PathsFromEnv).
package localcluster
