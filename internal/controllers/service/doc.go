// Package service is the LoadBalancer Service controller, the IPAM-operator's
// successor: one IPAddressClaim per family for each served Service, against the
// GlobalVitistackIPPool of its zone, make before break, and the addresses handed to
// MetalLB. It talks to the IPAM-API only through its claims.
package service

// The actions of the events the Service controller records.
const (
	actionAllocate = "Allocate"
	actionRotate   = "RotateSecret"
)
