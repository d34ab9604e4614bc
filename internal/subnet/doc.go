// Package subnet picks node addresses in subnet mode: the usable host addresses of a
// pool's subnet, in order, without the network address, the IPv4 broadcast address,
// the gateway and excluded addresses. Pure logic: no Kubernetes, no IPAM-API.
package subnet
