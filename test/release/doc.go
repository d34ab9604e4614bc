// Package release checks the folder `make release` writes (E2E_RELEASE_ASSETS): every
// asset a release carries is there and nothing else, SHA256SUMS matches them, and the
// versions inside agree (the images, clusterctl's metadata.yaml, the chart's version and
// appVersion, the changelog); and the pinned clusterctl (E2E_CLUSTERCTL) renders the
// components files as clusterctl init installs them: not without
// VITISTACK_IPAM_API_URL, and with the management install's Service controller and
// its webhook's calls on exactly when VITISTACK_SERVICES says so. It holds tests only.
package release
