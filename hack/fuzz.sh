#!/usr/bin/env bash
# Fuzzes every Fuzz target of the repository for FUZZTIME ($1) each (make fuzz).
#
# Go before 1.27 can end a time-limited fuzz run with a bare "context deadline
# exceeded" failure when -fuzztime runs out while a worker is busy (golang/go#75804):
# no input failed and none is written. Such a run counts as passed; any other failure,
# or one that wrote a failing input to testdata/fuzz, fails.
set -uo pipefail
fuzztime=${1:?usage: hack/fuzz.sh FUZZTIME}
cd "$(git rev-parse --show-toplevel)" || exit 1
for dir in $(grep -l '^func Fuzz' $(git ls-files '*_test.go') | xargs -n1 dirname | sort -u); do
  for target in $(grep -h -o '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go | cut -d' ' -f2); do
    echo "fuzzing $target (./$dir) for $fuzztime"
    corpus="$dir/testdata/fuzz/$target"
    before=$(ls "$corpus" 2>/dev/null | sort)
    out=$(mktemp)
    if go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" "./$dir" 2>&1 | tee "$out"; then
      rm -f "$out"
      continue
    fi
    after=$(ls "$corpus" 2>/dev/null | sort)
    if [ "$before" = "$after" ] && grep -q '^    context deadline exceeded$' "$out" && ! grep -q -e '^panic:' -e 'Failing input written' "$out"; then
      echo "$target: Go's fuzz coordinator stopped with \"context deadline exceeded\" (golang/go#75804); no input failed"
      rm -f "$out"
      continue
    fi
    rm -f "$out"
    exit 1
  done
done
