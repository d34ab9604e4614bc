// Package webhooks holds the validating admission webhooks for what CEL in the CRDs
// cannot check because it needs a lookup (pools in use). Webhooks never allocate or
// release addresses; that is the controllers' work.
package webhooks
