// Package manager wires the provider together: its flags, the scheme, the indexes,
// the controllers and the webhooks on a controller-runtime manager. cmd/manager and the
// integration tests use it alike, so the tests run the real wiring.
package manager
