// Package templates checks the examples in templates/ as a user runs them: every file
// renders with clusterctl (`generate cluster --from` for cluster-template-*.yaml,
// `generate yaml --from` for the rest), and every rendered object is accepted by a real
// kube-apiserver in a server-side apply dry run. The API server has this provider's CRDs
// and webhooks (internal/testenv) and the real CRDs of the infrastructure providers the
// overlays are written for, from the Go modules pinned in hack/tools/provider-crds.
// The manager's controllers run against the IPAM-API stand-in, so a flow of several
// templates (a control-plane endpoint claimed before the cluster is rendered) is run
// for real.
// `make test` builds bin/clusterctl and sets E2E_CLUSTERCTL; without it the tests skip.
// It holds tests only.
package templates
