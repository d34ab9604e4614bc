// Package chaos holds what the fault scenarios check and report: the accounting oracle
// (Account: what the IPAM-API holds against what the cluster records, by class), the
// canary scan's matching (Needles, Find: a secret value in every form redaction cuts),
// and the summary table. The scenarios are the process-level ones in test/e2e, the
// envtest ones with an injected clock in internal/controllers and the unit fault matrix
// in internal/controllers/claim. Each scenario records a row, failed or not; with
// CHAOS_ROWS naming a file (make test-chaos), rows are appended there too, so the last
// suite to run prints the table of all of them.
package chaos
