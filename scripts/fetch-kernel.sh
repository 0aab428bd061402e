#!/usr/bin/env bash
# fetch-kernel.sh: unpack Debian's own kernel package (vmlinuz + modules) into a folder, once.
#
# Usage: scripts/fetch-kernel.sh [DIR]      (default: out/images/kernel)
# Prints DIR. Afterwards DIR/vmlinuz is the bzImage, DIR/kver the version and
# DIR/lib/modules/$(cat DIR/kver)/ the modules. The package is fetched with
# `apt-get download` and unpacked with `dpkg-deb -x`: installing it would run
# the initramfs and bootloader hooks of this host.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$top/out/images/kernel}
if [ -s "$dir/kver" ] && [ -s "$dir/vmlinuz" ]; then
	echo "$dir"
	exit 0
fi
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
if [ -z "$pkg" ]; then
	echo "fetch-kernel: apt-cache knows no linux-image-amd64; run apt-get update" >&2
	exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q "$pkg" >&2) || {
	apt-get update -q >&2
	(cd "$tmp" && apt-get download -q "$pkg" >&2)
}
mkdir -p "$dir"
dpkg-deb -x "$tmp"/*.deb "$dir"
kver=${pkg#linux-image-}
cp "$dir/boot/vmlinuz-$kver" "$dir/vmlinuz"
echo "$kver" >"$dir/kver"
echo "$dir"
