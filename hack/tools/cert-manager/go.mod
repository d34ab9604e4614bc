// Pins cert-manager's module only for its CRDs (deploy/crds): the offline clusterctl
// repository (hack/local-repository.sh) ships them as a CRD-only "cert-manager" that
// passes clusterctl's readiness check. Nothing here is compiled.
module github.com/vitistack/cluster-api-ipam-provider-vitistack/hack/tools/cert-manager

go 1.26

require github.com/cert-manager/cert-manager v1.21.1
