// Package diagnostics serves the manager's metrics and pprof endpoints the way Cluster
// API providers do (the --diagnostics-address, --insecure-diagnostics and --tls-* flags
// of sigs.k8s.io/cluster-api/util/flags): over https, each request authenticated with a
// TokenReview and authorized with a SubjectAccessReview for its path, unless insecure.
//
// It does what controller-runtime's metrics filter does with the API server's own
// delegating authenticator and authorizer (the same cache times, the same retries of a
// review that failed for a passing reason), without linking k8s.io/apiserver and with
// it CEL, gRPC and OpenTelemetry's SDK and exporters: the manager's binary is 15 MB
// smaller, and its resident code about 10 MiB. One difference, on purpose: a token the
// API server does not know is a 401 (remembered for 10 s), not a 500.
package diagnostics
