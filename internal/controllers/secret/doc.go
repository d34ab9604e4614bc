// Package secret is the Secret protector: it keeps the ipam.vitistack.io/secret-in-use
// finalizer, and the fingerprint of the value, on every Secret that a pool (its
// spec.secretRef, else the default Secret), a claim's record or an IPAddress's record
// names, and removes both once nothing does. It acts on what the cluster records (not
// on what happened): enqueued when a pool or a record names other Secrets, and every
// --secret-recheck-interval for a protected Secret. It lists the Secrets it protects in
// a ConfigMap (the ledger) that every new leader looks at again, since a record that
// went while no leader ran is heard of by no one. No other code touches that finalizer.
package secret
