// Package chaos holds the summary table of the chaos scenarios: the process-level ones
// in test/e2e and the envtest ones with an injected clock in internal/controllers. Each
// scenario records a row; with CHAOS_ROWS naming a file (make test-chaos), rows are
// appended there too, so the last suite to run prints the table of all of them.
package chaos
