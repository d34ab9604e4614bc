// Package secret is the Secret protector: it keeps the ipam.vitistack.io/secret-in-use
// finalizer, and the fingerprint of the value, on every Secret that a claim's record or
// an IPAddress's record names, and removes both once nothing does. It acts on what the
// cluster records (not on what happened): enqueued when a record names other Secrets,
// and every ten minutes for a protected Secret. No other code touches that finalizer.
package secret
