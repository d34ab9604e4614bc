// Package docs checks the repository's Markdown: every link resolves inside the repository.
//
// Its test reads README.md and every other Markdown file of the repository (outside
// bin/, out/, .git/, vendor/ and testdata/), and checks each link and image outside code:
// http(s) and mailto links are left alone (nothing is fetched), every other target must
// be a relative path to a file or directory inside the repository, and an anchor must
// name a heading of the Markdown file it points into, by GitHub's rules.
//
// Other tests keep the reference pages true to the code: docs/metrics.md, the alert
// rules and dashboard of config/observability and the rules' promtool tests name only
// metrics, labels and label values the provider emits, and reasons it sets; the runbooks' commands are
// read-only kubectl commands of resources named with their API group. RunbookCommands,
// which reads those commands, is exported for the end-to-end suite, which runs them
// against a live control plane.
package docs
