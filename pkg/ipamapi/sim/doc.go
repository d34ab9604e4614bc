// Package sim is an in-process stand-in for the vitistack IPAM-API (v1.0.40 wire contract): routes, validation, decision table, retention, sweeper, fault injection and a Go/JSON inspection API for tests.
// It holds no client code, no Kubernetes code and no real NetBox or MongoDB; the binary around it lives in cmd/ipam-api-sim and the contract tests in test/contract.
package sim
