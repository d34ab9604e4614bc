// Package release checks the folder `make release` writes (E2E_RELEASE_ASSETS): every
// asset a release carries is there and nothing else, SHA256SUMS matches them, and the
// versions inside agree (the images, clusterctl's metadata.yaml, the chart's version and
// appVersion, the changelog). It holds tests only.
package release
