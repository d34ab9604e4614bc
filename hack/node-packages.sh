#!/usr/bin/env bash
# node-packages.sh: installs what the test node runs from Debian's packages when it is
# not on the machine: containerd (1.6, with its runc shim and ctr), runc, nft (kube-proxy's
# nftables mode, the CNI portmap plugin) and ip (iproute2, for the namespaces). Debian's,
# not built from the Go module proxy: they install in seconds, where containerd and runc
# from source cost minutes of a cold CI run, and runc needs libseccomp's headers besides.
# Debian 12 has containerd 1.6 and runc 1.1; a machine that has them already keeps its
# own. Needs root (as the node itself does); nothing is started or enabled.
set -euo pipefail
for tool in nsenter unshare mount; do
	command -v "$tool" >/dev/null 2>&1 || { echo "node-packages: $tool is not on PATH (util-linux, mount)" >&2; exit 1; }
done
missing=()
for pair in containerd:containerd ctr:containerd containerd-shim-runc-v2:containerd runc:runc nft:nftables ip:iproute2; do
	command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ $(id -u) -ne 0 ]]; then
	echo "node-packages: ${missing[*]} missing, and installing them needs root: apt-get install ${missing[*]}" >&2
	exit 1
fi
echo "Installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
# Nothing started or enabled: invoke-rc.d and deb-systemd-invoke ask policy-rc.d first.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
	printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
	trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
	{ apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
