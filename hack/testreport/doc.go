// Command testreport runs `go test -json …` and prints what a CI log needs: the output
// of `go test` without -v (the output of a failing test, what a package prints outside
// its tests), then a line per package with how many tests ran, passed, failed and were
// skipped, and last, where a log cut to its end still shows them, the failed tests with
// their last messages.
//
//	testreport [-allow-skip REGEXP] [-require-tests [-allow-no-tests REGEXP]] -- go test -json ./...
//
// It fails (exit code 1) when go test fails, and also when a test skipped that
// -allow-skip does not name ("package TestName", matched anywhere), or, with
// -require-tests, when a package with test files ran no test (but those -allow-no-tests
// names, which hold benchmarks only): in CI every suite must run, and a
// suite that skipped itself (a dropped E2E_* variable, a tool not built) or a -run that
// matches nothing would otherwise end in the same "ok" line as one that passed.
package main
