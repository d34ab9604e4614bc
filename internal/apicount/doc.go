// Package apicount reads kube-apiserver's apiserver_request_total counter and answers
// how many requests of each verb reached each resource between two readings. The
// write-budget test and the benchmarks use it to count what the provider writes.
package apicount
