#!/usr/bin/env bash
# nested.sh: run a script inside a QEMU TCG guest that has KVM (nested SVM), with pvisor in it.
#
# Usage: tests/kvm/nested.sh [--build DIR] [--smp N] [--mem MiB] [--timeout S]
#                            [--qemu-inside] SCRIPT [ARG...]
#
# This host has no /dev/kvm. QEMU in software emulation with -cpu max emulates
# AMD SVM with nested paging, so Debian's own kernel booted under it can load
# kvm and kvm-amd and offer /dev/kvm (see /work/shared/reference/nested-kvm/).
# The outer guest's initramfs holds busybox, the kvm modules, the build's
# pvisor, pvisor-pool and pvisor-guest with their shared libraries, the inner
# guest images from scripts/guest-image.sh, and tests/kvm/*.sh. Its /init loads
# the modules and runs SCRIPT (a file in tests/kvm/) with ARGs under busybox sh,
# then powers off. --qemu-inside adds qemu-system-x86_64, for comparisons.
#
# Output: the outer console on stdout (also in out/nested/<script>.log). Exit
# status: the script's, 77 when QEMU is not installed or the outer guest found
# no /dev/kvm, 124 when it timed out twice (one retry: see below), 1 when the outer guest
# died without a status.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build smp=2 mem=2048 tmo=300 qemu_inside=0 npt=${PVISOR_NESTED_NPT:-1}
while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$(cd "$2" && pwd); shift 2 ;;
	--smp) smp=$2; shift 2 ;;
	--mem) mem=$2; shift 2 ;;
	--timeout) tmo=$2; shift 2 ;;
	--qemu-inside) qemu_inside=1; shift ;;
	--npt) npt=$2; shift 2 ;;
	-h|--help) sed -n '2,20p' "$0"; exit 0 ;;
	-*) echo "nested.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || { echo "nested.sh: which script? (a file in tests/kvm/)" >&2; exit 2; }
script=$(basename "$1"); shift
[ -f "$top/tests/kvm/$script" ] || { echo "nested.sh: no tests/kvm/$script" >&2; exit 2; }
for t in qemu-system-x86_64 cpio busybox; do
	if ! command -v $t >/dev/null; then
		echo "SKIP: $t is not installed (apt-get install qemu-system-x86 cpio busybox-static;" \
		     "scripts/setup.sh does it)"
		exit 77
	fi
done

work=$top/out/nested
mkdir -p "$work"
kdir=$("$top/scripts/fetch-kernel.sh") || { echo "nested.sh: cannot fetch Debian's kernel" >&2; exit 1; }
kver=$(cat "$kdir/kver")
img=$top/out/images
if [ -x "$top/scripts/guest-image.sh" ]; then
	"$top/scripts/guest-image.sh" --build "$build" "$img" >"$work/guest-image.log" 2>&1 &&
	"$top/scripts/guest-image.sh" --tiny --build "$build" "$img" >>"$work/guest-image.log" 2>&1 ||
	{ cat "$work/guest-image.log"; echo "nested.sh: scripts/guest-image.sh failed" >&2; exit 1; }
fi

# copy_bin FILE DESTDIR: the program and every shared library ldd names, at their own paths.
copy_bin() {
	local f=$1 dst=$2 lib
	cp -L "$f" "$dst/" || return 1
	for lib in $(ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib/{print $1}'); do
		[ -e "$root$lib" ] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
	done
}

root=$work/root.$$
rm -rf "$root"
mkdir -p "$root"/{bin,mods,opt/pvisor/bin,images,tests,proc,sys,dev,tmp,run,etc}
trap 'rm -rf "$root" "$work/outer-initrd.$$.cpio"' EXIT
cp "$(command -v busybox)" "$root/bin/busybox"
file -L "$root/bin/busybox" 2>/dev/null | grep -q 'statically' ||
	{ echo "nested.sh: busybox is not the static one (apt-get install busybox-static)" >&2; exit 1; }
m=$kdir/lib/modules/$kver/kernel
for k in virt/lib/irqbypass.ko drivers/crypto/ccp/ccp.ko arch/x86/kvm/kvm.ko arch/x86/kvm/kvm-amd.ko; do
	cp "$m/$k" "$root/mods/"
done
for b in vmm/pvisor pool/pvisor-pool guest/pvisor-guest tests/kvm/kvm-bootmeter; do
	[ -x "$build/$b" ] && copy_bin "$build/$b" "$root/opt/pvisor/bin"
done
[ -x "$root/opt/pvisor/bin/pvisor" ] || { echo "nested.sh: no $build/vmm/pvisor: build first" >&2; exit 1; }
cp "$kdir/vmlinuz" "$root/images/vmlinuz"
for f in initrd.img tiny-initrd.img; do [ -f "$img/$f" ] && cp "$img/$f" "$root/images/"; done
cp "$top"/tests/kvm/*.sh "$root/tests/"
if [ "$qemu_inside" = 1 ]; then
	mkdir -p "$root/usr/bin" "$root/usr/share/qemu"
	copy_bin "$(command -v qemu-system-x86_64)" "$root/usr/bin"
	cp /usr/share/qemu/{bios-microvm.bin,qboot.rom,linuxboot_dma.bin,pvh.bin} "$root/usr/share/qemu/" 2>/dev/null
fi
cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox mkdir -p /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
export PATH=/opt/pvisor/bin:/usr/bin:/bin:/sbin:/usr/sbin
npt=1
for a in $(cat /proc/cmdline); do case $a in pvt.npt=*) npt=${a#pvt.npt=} ;; esac; done
for k in irqbypass ccp kvm; do insmod /mods/$k.ko 2>/dev/null || echo "@@ insmod $k failed"; done
insmod /mods/kvm-amd.ko npt=$npt || echo "@@ insmod kvm-amd failed"
if [ ! -c /dev/kvm ]; then
	echo "@@NESTED-RC=77 (no /dev/kvm in the outer guest: does QEMU emulate SVM here?)"
	poweroff -f
fi
script= args=
for a in $(cat /proc/cmdline); do
	case $a in pvt.script=*) script=${a#pvt.script=} ;; pvt.arg=*) args="$args ${a#pvt.arg=}" ;; esac
done
echo "@@ nested: /dev/kvm ready at uptime $(cut -d' ' -f1 /proc/uptime) s, running $script$args"
cd /tests
sh "/tests/$script" $args
echo "@@NESTED-RC=$?"
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet) >"$work/outer-initrd.$$.cpio" ||
	{ echo "nested.sh: cpio failed" >&2; exit 1; }

append="console=ttyS0 loglevel=3 panic=-1 rdinit=/init pvt.script=$script pvt.npt=$npt"
for a in "$@"; do append="$append pvt.arg=$a"; done
log=$work/${script%.sh}.log
boot_outer() { # $1 = log file; returns QEMU's status (124: timed out)
	timeout "$tmo" qemu-system-x86_64 -machine mem-merge=off -accel tcg,thread=multi -cpu max \
		-smp "$smp" -m "$mem" -nographic -no-reboot -nodefaults -serial stdio -monitor none \
		-kernel "$kdir/vmlinuz" -initrd "$work/outer-initrd.$$.cpio" -append "$append" </dev/null |
		stdbuf -oL tr -d '\r' | tee "$1"
	return "${PIPESTATUS[0]}"
}
boot_outer "$log"
qrc=$?
# The emulated SVM host (Linux 6.1 under TCG) now and then locks up for good (seen: a soft
# lockup in KVM's teardown after a clean guest exit). One retry, said out loud, so that
# the emulator's hang does not decide the result; a hang of pvisor's own hangs twice.
if [ "$qrc" = 124 ]; then
	echo "nested.sh: the outer guest hung for $tmo s (log kept in $log.hung); retrying once"
	mv "$log" "$log.hung"
	boot_outer "$log"
	qrc=$?
fi
rm -f "$work/outer-initrd.$$.cpio"
[ "$qrc" = 124 ] && { echo "nested.sh: timed out again after $tmo s"; exit 124; }
rc=$(sed -n 's/^@@NESTED-RC=\([0-9]*\).*/\1/p' "$log" | tail -1)
[ -n "$rc" ] || { echo "nested.sh: the outer guest ended without a status (QEMU exit $qrc)"; exit 1; }
exit "$rc"
