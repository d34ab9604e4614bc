// Command node runs cert-manager's controller, webhook and cainjector (cert-manager
// v1.21.1, the version of the CRDs this repository ships) for the tests on a node.
//
// cert-manager's own commands are modules of their own that the Go module proxy these
// tests build from does not serve; their code is cert-manager's root module, which it
// does. This command wires that code up the way cert-manager's commands do, with the
// flags cert-manager's Helm chart passes, so the chart runs it unchanged under
// cert-manager's own image names. The module is named under cert-manager's path
// because the webhook's admission chain is in cert-manager's internal packages.
//
// Left out, on purpose: the ACME, Vault and Venafi issuers (the Venafi client is not
// on the proxy), and the certificate shims for Ingress and Gateway. SelfSigned and CA
// issuers, Certificates, CertificateRequests and their approval, the webhook's
// validation, defaulting and conversion, and CA injection are cert-manager's own.
//
// The binary runs what its name says, as busybox does: each image puts it at /controller,
// /webhook or /cainjector and runs it from there.
package main
