#!/usr/bin/env bash
# Builds the previous release of this provider from its commit in this repository's
# history, for the upgrade tests: its manager binary and its release manifests, as that
# commit's own `make release-manifests` wrote them.
#
#   <out>/manager                          the manager, built as the image builds it
#   <out>/ipam-components.yaml             clusterctl's components (config/default)
#   <out>/ipam-components-workload.yaml    the workload install (config/workload)
#   <out>/metadata.yaml                    its release series
#
# Usage: hack/previous-release.sh <commit> <version> <out> <kustomize>
# The commit's dependencies (its go.mod) come from the Go module proxy.
set -euo pipefail

[ $# -eq 4 ] || { echo "usage: $0 <commit> <version> <out> <kustomize>" >&2; exit 2; }
commit=$1 version=$2 out=$3 kustomize=$4
root=$(cd "$(dirname "$0")/.." && pwd)

if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
	echo "$version ($commit) is not in this clone's history: the upgrade tests build it from there." >&2
	echo "Clone with history (not --depth), or run: git fetch --unshallow" >&2
	exit 1
fi

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git -C "$root" archive "$commit" | tar -x -C "$src"
mkdir -p "$out"
# As that release's Makefile and Dockerfile built and packaged it.
img=ghcr.io/vitistack/cluster-api-ipam-provider-vitistack:$version
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-X main.version=$version" -o "$out/manager.new" ./cmd/manager)
"$kustomize" build "$src/config/default" | sed "s|image: controller:latest|image: $img|" >"$out/ipam-components.yaml"
"$kustomize" build "$src/config/workload" | sed "s|image: controller:latest|image: $img|" >"$out/ipam-components-workload.yaml"
cp "$src/metadata.yaml" "$out/metadata.yaml"
# The binary last: make takes it as the sign that everything is there.
mv "$out/manager.new" "$out/manager"
echo "$version ($commit) built into $out"
