// Package writebudget holds the write-budget test: it counts, with kube-apiserver's
// own apiserver_request_total, what the provider writes to bind a burst of claims
// (the budget is four writes a claim; it takes three: the finalizer with the pending
// record, the IPAddress, one status patch with addressRef and Ready; pool status
// coalesced), and that a restarted provider
// writes nothing and calls the IPAM-API for nothing when every claim is bound.
package writebudget
