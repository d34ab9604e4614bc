// Command docgen writes docs/pool-api.md, the reference of the pool kinds, from their
// CRDs under config/crd/bases (so from the Go types and their markers): every field of
// spec and status with its type, default, validation and description, and the rules
// on the whole object. `make manifests` runs it after regenerating the CRDs; its test
// fails when the page in the repository differs from what it would write.
package main
