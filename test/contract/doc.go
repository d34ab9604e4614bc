// Package contract is the wire-contract suite of the vitistack IPAM-API (docs/ipam-api.md): raw HTTP cases with literal JSON bodies and exact status, headers and bytes.
// It holds tests only, no client code; by default it runs against the stand-in (pkg/ipamapi/sim), with IPAM_API_URL set against a real deployment.
package contract
