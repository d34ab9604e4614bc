#!/usr/bin/env bash
# Builds a clusterctl repository that works with no network but the Go module proxy:
#
#   <repo>/ipam-vitistack/<version>/      this provider's release (make release-manifests), with the
#                                         workload install beside it (the e2e installs it too)
#   <repo>/cluster-api/<capi>/            core Cluster API    } kustomize build from the
#   <repo>/bootstrap-kubeadm/<capi>/      kubeadm bootstrap   } sigs.k8s.io/cluster-api
#   <repo>/control-plane-kubeadm/<capi>/  kubeadm control pl. } module in the Go module cache
#   <repo>/cert-manager/<cm>/             cert-manager's CRDs only (no controllers)
#   <repo>/clusterctl.yaml                points clusterctl at all of the above
#
# Use it with: clusterctl init --config <repo>/clusterctl.yaml --ipam vitistack
# (the first init also installs core Cluster API and the kubeadm providers).
#
# Usage: hack/local-repository.sh <repo-dir> <release-dir> <kustomize>
# The versions are the ones pinned in go.mod (Cluster API) and
# hack/tools/cert-manager/go.mod (cert-manager).
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 <repo-dir> <release-dir> <kustomize>" >&2; exit 2; }
# The repository is rebuilt from scratch: refuse a folder that is not one.
if [ -d "$1" ] && [ -n "$(ls -A "$1")" ] && [ ! -f "$1/clusterctl.yaml" ]; then
	echo "$1 is not empty and holds no clusterctl.yaml: not deleting it" >&2
	exit 1
fi
repo=$(mkdir -p "$1" && cd "$1" && pwd) release=$2 kustomize=$3
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(basename "$release")

module() { # <dir with go.mod> <module path> <field>: the pinned module's Dir or Version
	(cd "$1" && go mod download -json "$2") | sed -n "s/^[[:space:]]*\"$3\": \"\(.*\)\",\$/\1/p"
}
capi=$(module "$root" sigs.k8s.io/cluster-api Dir)
CAPI_VERSION=$(module "$root" sigs.k8s.io/cluster-api Version)
cm=$(module "$root/hack/tools/cert-manager" github.com/cert-manager/cert-manager Dir)
CERT_MANAGER_VERSION=$(module "$root/hack/tools/cert-manager" github.com/cert-manager/cert-manager Version)
[ -d "$capi/core/config/default" ] || { echo "Cluster API not found in the module cache" >&2; exit 1; }
[ -d "$cm/deploy/crds" ] || { echo "cert-manager not found in the module cache" >&2; exit 1; }

# Written beside it, and swapped in only if something changed: a clusterctl reading the
# repository meanwhile (the e2e tests while `make quickstart` runs) finds it whole.
final=$repo
repo=$(mktemp -d "$final.new.XXXXXX")
trap 'rm -rf "$repo"' EXIT

# This provider, as released.
mkdir -p "$repo/ipam-vitistack/$version"
cp "$release/ipam-components.yaml" "$release/ipam-components-workload.yaml" "$release/metadata.yaml" "$repo/ipam-vitistack/$version/"

# Core Cluster API and the kubeadm providers that clusterctl's first init installs.
provider() { # <folder> <components file> <kustomize dir>
	mkdir -p "$repo/$1/$CAPI_VERSION"
	"$kustomize" build "$capi/$3" >"$repo/$1/$CAPI_VERSION/$2"
	install -m 0644 "$capi/metadata.yaml" "$repo/$1/$CAPI_VERSION/metadata.yaml"
}
provider cluster-api core-components.yaml core/config/default
provider bootstrap-kubeadm bootstrap-components.yaml bootstrap/kubeadm/config/default
provider control-plane-kubeadm control-plane-components.yaml controlplane/kubeadm/config/default

# cert-manager: only its CRDs (deploy/crds holds them as plain YAML). clusterctl's check
# creates an Issuer and a Certificate, which needs nothing more.
mkdir -p "$repo/cert-manager/$CERT_MANAGER_VERSION"
certmanager=$repo/cert-manager/$CERT_MANAGER_VERSION/cert-manager.yaml
for f in "$cm"/deploy/crds/*.yaml; do
	echo "---"
	sed -e '/^---$/d' "$f"
done >"$certmanager"
crds=$(grep -c '^kind: CustomResourceDefinition$' "$certmanager")
if [ "$crds" -ne 6 ] || grep -q '{{' "$certmanager"; then
	echo "cert-manager's CRDs did not come out as expected ($crds CRDs, templating left?): $certmanager" >&2
	exit 1
fi

cat >"$repo/clusterctl.yaml" <<EOF
# clusterctl configuration for the offline repository next to this file.
providers:
  - name: cluster-api
    type: CoreProvider
    url: file://$final/cluster-api/$CAPI_VERSION/core-components.yaml
  - name: kubeadm
    type: BootstrapProvider
    url: file://$final/bootstrap-kubeadm/$CAPI_VERSION/bootstrap-components.yaml
  - name: kubeadm
    type: ControlPlaneProvider
    url: file://$final/control-plane-kubeadm/$CAPI_VERSION/control-plane-components.yaml
  - name: vitistack
    type: IPAMProvider
    url: file://$final/ipam-vitistack/$version/ipam-components.yaml
cert-manager:
  url: file://$final/cert-manager/$CERT_MANAGER_VERSION/cert-manager.yaml
  version: $CERT_MANAGER_VERSION
EOF
chmod 0755 "$repo"
if ! diff -r -q "$repo" "$final" >/dev/null 2>&1; then
	rm -rf "$final"
	mv "$repo" "$final"
fi
echo "clusterctl repository: $final (clusterctl init --config $final/clusterctl.yaml --ipam vitistack)"
