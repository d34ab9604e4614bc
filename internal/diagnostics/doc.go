// Package diagnostics serves the manager's metrics and pprof endpoints the way Cluster
// API providers do (the --diagnostics-address, --insecure-diagnostics and --tls-* flags
// of sigs.k8s.io/cluster-api/util/flags): over https, each request authenticated with a
// TokenReview and authorized with a SubjectAccessReview for its path, unless insecure.
//
// It does what controller-runtime's metrics filter does with the API server's own
// delegating authenticator and authorizer, without linking k8s.io/apiserver (and with
// it CEL, gRPC and OpenTelemetry): the manager's binary is 15 MB smaller, and so is
// the part of it that stays resident.
package diagnostics
