#!/usr/bin/env bash
# Usage: <command> | hack/write-if-changed.sh FILE
# Writes standard input to FILE if FILE is missing or differs, by renaming a file written
# beside it: a reader sees the old content or the new, never a file half written.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: <command> | $0 FILE" >&2; exit 2; }
tmp=$(mktemp "$1.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cat >"$tmp"
if ! cmp -s "$tmp" "$1"; then
	chmod 0644 "$tmp"
	mv -f "$tmp" "$1"
fi
