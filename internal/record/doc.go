// Package record holds what the provider records about a registration in the IPAM-API:
// the JSON record on an IPAddressClaim (written before the first request, the "create
// pending" pattern, and carrying a rotation intent), the labels and annotations on an
// IPAddress, the holder key two claims must never share, and the fingerprint of a
// Secret's value kept on the Secret. It is pure data: no client, no I/O.
package record
