// Package testenv starts what the integration tests run against: a real kube-apiserver
// and etcd (envtest) with the real CAPI and Vitistack CRDs and webhooks, the IPAM-API
// stand-in, and the provider's real manager wiring. Test code only.
package testenv
