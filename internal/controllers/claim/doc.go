// Package claim is the IPAddressClaim controller: a claim loop modelled on ipamutil's
// (reconciler.go, which writes a claim's metadata and status in at most one patch
// each) with an Adapter and a Handler (ipamutil's ClaimHandler) that turn claims of
// Vitistack pools into IPAM-API registrations and IPAddresses, rotate their secrets as recorded intents, and release them on deletion
// from what is recorded alone. Every reconcile ends in one outcome, which status.go
// turns into the claim's conditions and events.
package claim
