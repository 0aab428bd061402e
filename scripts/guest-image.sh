#!/usr/bin/env bash
# guest-image.sh: build the guest kernel + initrd that run pvisor-guest (and a tiny boot-time initrd).
#
# Usage: scripts/guest-image.sh [--build DIR] [--tiny] [--force] [--modules "M.."] [OUTDIR]
#   OUTDIR        where the images go (default: out/images)
#   --build DIR   meson build dir holding guest/pvisor-guest (default: build)
#   --tiny        build OUTDIR/tiny-initrd.img instead: busybox and an /init that
#                 prints PVG-INIT and powers off at once (boot-time measurement)
#   --force       rebuild even if nothing changed
#   --modules "M.."  more modules for the full image, e.g. "virtio_pci" to boot
#                 it under QEMU's PC machine with virtio-blk-pci (default: none)
#
# Produces OUTDIR/vmlinuz (Debian's kernel, via scripts/fetch-kernel.sh) and
# OUTDIR/initrd.img, a gzip'd newc cpio holding:
#   /bin/busybox (+ applet links), /bin/pvisor-guest, /dev/console,
#   /lib/modules/*.ko: virtio_ring, virtio, virtio_mmio, virtio_blk and the
#     optional virtio_pmem stack (libnvdimm, nd_virtio, nd_btt, nd_pmem), in
#     dependency order (each module's depends= read from its .modinfo section),
#   /init: prints `PVG-INIT uptime=<seconds>` first, mounts proc/sys/devtmpfs,
#     insmods the modules in order (a failure prints `PVG-INIT warning: ...` and
#     goes on), waits up to 5 s for pvg.load's device if it is under /dev, runs
#     pvisor-guest on /dev/console, prints `PVG-INIT agent_status=N exit=WHAT`,
#     then `poweroff -f`, `reboot -f` or sleeps forever per pvg.exit.
# Boot with: console=ttyS0 panic=-1 pvg.workload=... (see pvisor-guest --help).
# Idempotent: a stamp of every input sits beside each image; when it matches,
# nothing is rebuilt. Needs busybox-static and cpio (scripts/setup.sh installs
# them; if busybox-static is missing this script installs it with apt-get).
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
build=$top/build
tiny=0
force=0
extra_mods=
out=
while [ $# -gt 0 ]; do
	case $1 in
	--build) [ $# -ge 2 ] || { echo "guest-image: --build needs a directory" >&2; exit 2; }
		build=$2; shift 2 ;;
	--tiny) tiny=1; shift ;;
	--force) force=1; shift ;;
	--modules) [ $# -ge 2 ] || { echo "guest-image: --modules needs a list" >&2; exit 2; }
		extra_mods=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) echo "guest-image: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) [ -z "$out" ] || { echo "guest-image: one OUTDIR only" >&2; exit 2; }
		out=$1; shift ;;
	esac
done
out=${out:-$top/out/images}
mkdir -p "$out"
out=$(cd "$out" && pwd)

busybox=/bin/busybox
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed"; then
	echo "guest-image: installing busybox-static" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends busybox-static >&2
fi
command -v cpio >/dev/null || { echo "guest-image: no cpio; apt-get install cpio" >&2; exit 1; }

kdir=$("$top/scripts/fetch-kernel.sh" "$top/out/images/kernel")
kver=$(cat "$kdir/kver")
moddir=$kdir/lib/modules/$kver/kernel
cmp -s "$kdir/vmlinuz" "$out/vmlinuz" || cp "$kdir/vmlinuz" "$out/vmlinuz"

# Modules: wanted ones first; the optional ones may be absent from another kernel.
want_mods=(virtio_ring virtio virtio_mmio virtio_blk)
opt_mods=(libnvdimm nd_virtio virtio_pmem nd_btt nd_pmem)

# Every .ko of the kernel by module name (dashes and underscores are the same).
declare -A ko
mod_index() {
	local f n
	while IFS= read -r f; do
		n=${f##*/}
		n=${n%.ko}
		ko[${n//-/_}]=$f
	done < <(find "$moddir" -name '*.ko')
}
# mod_file NAME: the .ko of a module name.
mod_file() {
	local n=${1//-/_}
	[ -n "${ko[$n]:-}" ] && echo "${ko[$n]}"
}
# mod_depends FILE: the depends= list of a .ko, comma separated (no modinfo needed).
mod_depends() {
	tr '\0' '\n' <"$1" | grep -a -m1 '^depends=' | sed 's/^depends=//'
}
order=()     # module names in load order
ordered=" "
# mod_add NAME: NAME after its dependencies, once. Fails if NAME has no .ko.
mod_add() {
	local f d
	case $ordered in *" $1 "*) return 0 ;; esac
	f=$(mod_file "$1") || return 1
	for d in $(mod_depends "$f" | tr ',' ' '); do
		mod_add "$d" || { echo "guest-image: $1 needs $d, which has no .ko" >&2; return 1; }
	done
	order+=("$1")
	ordered="$ordered$1 "
}

write_init() { # the full image's /init
	cat <<'EOF'
#!/bin/sh
# /init of the pvisor guest image (scripts/guest-image.sh): boot marker, modules, agent, exit.
/bin/busybox mount -t proc proc /proc
read -r up _ </proc/uptime
echo "PVG-INIT uptime=$up"
export PATH=/bin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
for m in $(cat /lib/modules/order); do
	insmod /lib/modules/$m.ko 2>/dev/null || echo "PVG-INIT warning: insmod $m failed"
done
load= how=poweroff
for w in $(cat /proc/cmdline); do
	case $w in
	pvg.load=*) load=${w#pvg.load=} ;;
	pvg.exit=*) how=${w#pvg.exit=} ;;
	esac
done
case $load in
/dev/*)
	i=0
	while [ ! -e "$load" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	[ -e "$load" ] || echo "PVG-INIT warning: $load did not appear in 5 s"
	;;
esac
/bin/pvisor-guest </dev/console >/dev/console 2>&1
rc=$?
echo "PVG-INIT agent_status=$rc exit=$how"
case $how in
reboot) reboot -f ;;
none) while :; do sleep 3600; done ;;
*) poweroff -f ;;
esac
EOF
}

write_tiny_init() {
	cat <<'EOF'
#!/bin/busybox sh
# /init of the tiny image (scripts/guest-image.sh --tiny): the boot marker, then power off.
/bin/busybox mount -t proc proc /proc
read -r up _ </proc/uptime
echo "PVG-INIT uptime=$up"
/bin/busybox poweroff -f
EOF
}

# stage DIR: busybox with its applet links and /dev/console, the common part of both images.
stage_base() {
	local d=$1 a
	mkdir -p "$d/bin" "$d/dev" "$d/proc" "$d/sys" "$d/tmp" "$d/lib/modules"
	cp "$busybox" "$d/bin/busybox"
	for a in $("$busybox" --list); do
		[ "$a" = busybox ] || ln -sf busybox "$d/bin/$a"
	done
	ln -sf bin "$d/sbin"
	# the kernel opens /dev/console for /init before devtmpfs is mounted
	mknod -m 600 "$d/dev/console" c 5 1 ||
		echo "guest-image: cannot mknod /dev/console (not root?): /init may have no console" >&2
}

# pack DIR IMAGE: a reproducible gzip'd newc cpio of DIR, replaced atomically (two runs
# at once each write their own temporary file; the last rename wins, both are whole).
pack() {
	(cd "$1" && find . -mindepth 1 | LC_ALL=C sort |
		cpio -o -H newc -R 0:0 --reproducible --quiet) | gzip -n -6 >"$2.tmp.$$"
	mv "$2.tmp.$$" "$2"
}

if [ "$tiny" = 1 ]; then
	img=$out/tiny-initrd.img
	inputs=("$busybox" "$0")
else
	img=$out/initrd.img
	agent=$build/guest/pvisor-guest
	[ -x "$agent" ] || { echo "guest-image: no $agent; build it first: ninja -C $build" >&2; exit 1; }
	mod_index
	for m in "${want_mods[@]}" ${extra_mods}; do
		mod_add "$m" || { echo "guest-image: no module $m under $moddir" >&2; exit 1; }
	done
	for m in "${opt_mods[@]}"; do
		mod_add "$m" || echo "guest-image: optional module $m left out" >&2
	done
	inputs=("$busybox" "$0" "$agent")
	for m in "${order[@]}"; do inputs+=("$(mod_file "$m")"); done
fi
stamp=$( (echo "$kver ${order[*]:-}"; sha256sum "${inputs[@]}") | sha256sum | cut -d' ' -f1)
if [ "$force" = 0 ] && [ -s "$img" ] && [ "$(cat "$img.stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "guest-image: $img is up to date"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stage_base "$tmp"
if [ "$tiny" = 1 ]; then
	write_tiny_init >"$tmp/init"
else
	write_init >"$tmp/init"
	cp "$agent" "$tmp/bin/pvisor-guest"
	for m in "${order[@]}"; do cp "$(mod_file "$m")" "$tmp/lib/modules/$m.ko"; done
	printf '%s\n' "${order[@]}" >"$tmp/lib/modules/order"
fi
chmod 755 "$tmp/init"
pack "$tmp" "$img"
echo "$stamp" >"$img.stamp"
echo "guest-image: wrote $img ($(du -k "$img" | cut -f1) KiB${order:+; modules: ${order[*]}})"
