// Package registrar is what every controller shares to talk to the IPAM-API safely:
// the Secrets (read uncached, the default one created on first use), the IPAM-API
// client of each endpoint, the in-flight table that keeps two requests for one IPAM-API
// identity or address from ever being in flight at once, the pool's base registration,
// and the queues that bring claims and Secrets to a controller from outside its watches. One Registrar is
// built by the manager and injected into the claim, pool and Service controllers.
package registrar
