// Package e2e tests the provider as a user installs and runs it: a control plane of
// real processes on loopback (etcd, kube-apiserver, kube-controller-manager),
// `clusterctl init --ipam vitistack` from the release artifacts in an offline
// repository, the manager binary as a process with the installed Deployment's arguments
// and RBAC, and the IPAM-API stand-in as a process. `make test` and `make test-e2e` run
// it (they build the artifacts and export their paths); plain `go test` skips it.
package e2e
