// Package claim is the IPAddressClaim controller. The Reconciler keeps ipamutil's contract for
// claims, writes a claim's metadata and status in at most one patch each, and holds the watches
// (watches.go) and what one process's claims share. A Handler is one reconcile of one claim: it
// turns claims of Vitistack pools into IPAM-API registrations and IPAddresses, rotates secrets
// as recorded intents, and releases on deletion from the records alone. Every reconcile ends
// in one outcome, which status.go turns into the claim's conditions and events.
package claim
