// Package chart checks the Helm chart (charts/cluster-api-ipam-provider-vitistack) with
// the pinned Helm binary (E2E_HELM; `make test` builds it): `helm lint`; `helm template`
// with the default values renders, object by object, what the release manifests install
// (E2E_RELEASE_DIR, from `make release-manifests`); the values land where they should
// (services.enabled among them); it refuses to render without ipamAPI.url, saying what
// to set; and values.schema.json refuses bad values naming the field. It holds tests
// only.
package chart
