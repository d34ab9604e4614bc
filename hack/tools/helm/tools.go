//go:build tools

// Package tools pins Helm, built into bin/helm by the Makefile: it lints, renders and
// packages the chart (make test, make helm-package) and installs it in the end-to-end
// tests. Its own module, so Helm's Kubernetes libraries never constrain the provider's.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
