// Package index holds the field indexes on the manager's cache that the controllers
// and webhooks look objects up by: claims and IPAddresses by pool, by IPAM-API holder
// key, by address and by the Secrets their records name; claims waiting for room.
package index
