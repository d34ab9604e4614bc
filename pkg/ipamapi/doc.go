// Package ipamapi is the typed client of the vitistack IPAM-API: Register (POST
// /v2/address) and Release (DELETE /v2/service) with per-request deadlines, connection
// reuse, TLS with a custom CA, and errors sorted into classes a controller can act on.
// It knows nothing about Kubernetes; the stand-in server lives in the sim sub-package.
package ipamapi
