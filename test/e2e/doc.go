// Package e2e tests the provider as a user installs and runs it: a control plane of
// real processes on loopback (etcd, kube-apiserver, kube-controller-manager),
// `clusterctl init --ipam vitistack` from the release artifacts in an offline
// repository, the manager binary as a process with the installed Deployment's arguments
// and RBAC, and the IPAM-API stand-in as a process. `make test` and `make test-e2e` run
// it (they build the artifacts and export their paths); plain `go test` skips it.
//
// The tests run in two lanes at once, one test at a time in each: those on the suite's
// control plane and IPAM-API stand-in, and those that start both of their own
// (newControlPlane). A test enters its lane first (onA.enter, onOwn.enter); the
// helpers that ask a stand-in take the control plane whose stand-in it is (simOf).
package e2e
