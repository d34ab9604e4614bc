// Command chart writes the Helm chart's templates (charts/cluster-api-ipam-provider-vitistack)
// from config/, so that the chart and the release manifests never drift: each install's
// objects as kustomize builds them for `make release-manifests`, with the chart's
// values put in (the manager's arguments, replicas, image, resources, the webhook
// certificate from cert-manager or an existing Secret, the excluded namespaces, the
// release's namespace), CRDs and the default secret's namespace kept on uninstall, and
// the alert rules and the dashboard of config/observability. `make manifests` runs it;
// test/chart checks what it renders.
package main
