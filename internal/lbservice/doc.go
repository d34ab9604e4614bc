// Package lbservice holds the ipam.vitistack.io annotations of Services of type
// LoadBalancer, as the IPAM-operator defined them: their defaults and how they are
// parsed and checked. The Service controller and the Service webhook share it; it
// reads no cluster state.
package lbservice
