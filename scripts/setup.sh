#!/usr/bin/env bash
# setup.sh: install what pvisor needs from Debian 12 and configure the build. Idempotent.
set -eu
need=(meson ninja-build pkg-config gcc liburing-dev libxxhash-dev liblz4-dev libzstd-dev
      libvirt-dev libjson-c-dev python3 gnuplot-nox
      qemu-system-x86 busybox-static cpio acpica-tools file)
missing=()
for p in "${need[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
cd "$(dirname "$0")/.."
[ -d build ] || meson setup build >/dev/null
ninja -C build
