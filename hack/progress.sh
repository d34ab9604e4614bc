#!/usr/bin/env bash
# progress.sh "WHAT" -- COMMAND [ARGS...]
#
# Runs COMMAND and says what it is doing: a line when it starts ("==> WHAT"), one every
# 30 s while it runs ("    ... still WHAT (1m30s)"), and how long it took ("    done in
# 2m05s: WHAT"). For the long steps of make (tool builds from source, test suites), which
# print nothing for minutes.
# COMMAND's own output passes through; its exit code is this script's.
set -uo pipefail
what=$1
shift
[[ ${1:-} == -- ]] && shift
interval=${PROGRESS_INTERVAL:-30}

took() {
	local s=$1
	if ((s >= 60)); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

echo "==> $what"
short=${what%% (*} # without the "(~N min …)" that the first line gives
start=$SECONDS
"$@" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid"; exit 130' INT TERM
next=$interval
while kill -0 "$pid" 2>/dev/null; do
	sleep 1
	if ((SECONDS - start >= next)) && kill -0 "$pid" 2>/dev/null; then
		echo "    ... still ${short,} ($(took $((SECONDS - start))))"
		next=$((next + interval))
	fi
done
wait "$pid"
rc=$?
if ((rc == 0)); then
	echo "    done in $(took $((SECONDS - start))): ${short,}"
else
	echo "    FAILED after $(took $((SECONDS - start))) (exit code $rc): $what"
fi
exit "$rc"
