// Package claim is the IPAddressClaim controller. Its Reconciler (reconciler.go, in the
// shape of Cluster API's controllers, keeping ipamutil's contract for claims) writes a
// claim's metadata and status in at most one patch each (patch.go); its Adapter holds
// the watches and what the claims of one process share, and a Handler is one reconcile
// of one claim: it turns claims of Vitistack pools into IPAM-API registrations and
// IPAddresses, rotates their secrets as recorded intents, and releases them on deletion
// from what is recorded alone. Every reconcile ends in one outcome, which status.go
// turns into the claim's conditions and events.
package claim
