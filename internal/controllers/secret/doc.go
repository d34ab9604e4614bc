// Package secret is the Secret protector: a level-triggered controller that keeps the
// ipam.vitistack.io/secret-in-use finalizer, and the fingerprint of the value, on every
// Secret that a claim's record or an IPAddress's record names, and removes both once
// nothing does. No other code touches that finalizer.
package secret
