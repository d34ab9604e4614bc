// Package help checks that every binary of the repository answers --help with its usage and exit code 0.
// It holds tests only: they list the main packages with 'go list', build each into a temporary directory and run it with --help and -h in an empty directory with an almost empty environment.
package help
