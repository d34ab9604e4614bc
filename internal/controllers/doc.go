// Package controllers holds the reconcilers: the ipamutil ProviderAdapter and
// ClaimHandler that turn IPAddressClaims into IPAM-API registrations and IPAddresses,
// and the pool status controller. HTTP details live in pkg/ipamapi; validation in
// internal/webhooks.
package controllers
