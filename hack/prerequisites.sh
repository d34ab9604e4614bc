#!/usr/bin/env bash
# prerequisites.sh: checks what `make quickstart` needs on PATH before it builds for half
# an hour: Go (at least the version go.mod names), git and make; kubectl only to explore
# afterwards (a warning). Everything else is built from the Go module proxy into bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=0
need() { # need TOOL WHY
	if ! command -v "$1" >/dev/null 2>&1; then
		echo "quickstart: $1 is not on PATH: $2" >&2
		missing=1
	fi
}
need go "install Go $(awk '$1 == "go" {print $2}' go.mod) or newer (https://go.dev/doc/install)"
need git "install git (the Go toolchain uses it for module versions)"
need make "install GNU make"
if command -v go >/dev/null 2>&1; then
	want=$(awk '$1 == "go" {print $2}' go.mod)
	have=$(go env GOVERSION | sed 's/^go//')
	if [[ $(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1) != "$want" ]]; then
		# A newer toolchain may be fetched by Go itself (GOTOOLCHAIN=auto) if the module proxy is reachable.
		if [[ $(go env GOTOOLCHAIN) == local ]]; then
			echo "quickstart: Go $have is older than the $want go.mod needs, and GOTOOLCHAIN=local forbids fetching it: install Go $want or newer" >&2
			missing=1
		fi
	fi
fi
if ! command -v kubectl >/dev/null 2>&1; then
	echo "quickstart: note: kubectl is not on PATH; the quickstart runs without it, but the commands it prints to explore need it" >&2
fi
exit "$missing"
