# t-blk.sh: a guest reads a file from virtio-blk into memory; bytes match, hints reach the plane (issue 4, test 4).
T=kvm-blk
. /tests/lib.sh
# The disk: the first 6 MiB of the kernel image (varied bytes, whole sectors).
disk=/tmp/disk.img
head -c 6291456 $K > $disk
want=$(pvisor-guest --file-digest $disk)
say "disk digest $want ($(wc -c < $disk) bytes)"

# --dedup off: KVM guests with the pool are not reliable yet (see t-share.sh); the hints
# are counted by the memory plane in every mode.
start_vm vm0 --mem 192M --dedup off --disk $disk,ro \
	--cmdline "pvg.load=/dev/vda pvg.hold=300 pvg.exit=poweroff"
line=$(pvg_event vm0 load 240) || { fail "vm0 never reported the load"; dump_vm vm0 60; finish; }
say "vm0: $line"
check "guest memory holds the disk's bytes (digest)" [ "$(json_field "$line" digest)" = "$want" ]
check "guest loaded every byte" [ "$(json_field "$line" bytes)" = "$(wc -c < $disk)" ]
# The boot loader hints the kernel and initrd too: measure a second load on its own.
h1=$(json_field "$(pvisor ctl --api-sock /run/vm0.api stats)" pages_hinted)
vm_cmd vm0 "load /dev/vda"
line=$(pvg_event vm0 load 120 2) || fail "vm0 did not answer the second load"
say "vm0: $line"
check "second load: the same bytes" [ "$(json_field "$line" digest)" = "$want" ]
h2=$(json_field "$(pvisor ctl --api-sock /run/vm0.api stats)" pages_hinted)
say "pages_hinted $h1 -> $h2"
check "file-read hints reached the memory plane (+$((h2 - h1)) pages for 1536 read)" \
	[ $((h2 - h1)) -ge 1536 ]
vm_cmd vm0 quit
wait_exit vm0 60
check "exit code 0 (got $RC)" [ "$RC" = 0 ]
[ "$fails" = 0 ] || dump_vm vm0 60
finish
