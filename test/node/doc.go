// Package node runs the provider the way clusters run it: the shipped image in Pods on a
// real kubelet, with containerd and runc, CNI bridge networking and kube-proxy's Service
// routing, installed by Helm. Everything lives in two network namespaces the suite makes
// itself (the node and a client host on its link), so no packet leaves them; the suite
// needs root. `make test-node` builds what it runs.
package node
