// Package pool is the controller of VitistackIPPool and GlobalVitistackIPPool status:
// whether the IPAM-API accepts the pool's zone, family and secret (a readiness check
// that changes nothing), whether its claims found its subnet outside its zone, and how
// many addresses are in use. Status is computed in one place from the cluster and the
// readiness check, and patched at most once per pool per second.
package pool
