# t-blk.sh: a guest reads a file from virtio-blk into memory; bytes match, hints reach the plane (issue 4, test 4).
T=kvm-blk
. /tests/lib.sh
# The disk: the first 6 MiB of the kernel image (varied bytes, whole sectors).
disk=/tmp/disk.img
head -c 6291456 $K > $disk
want=$(pvisor-guest --file-digest $disk)
say "disk digest $want ($(wc -c < $disk) bytes)"

# With the pool: the disk's reads land in guest RAM while the plane merges (the guest's
# page cache and the agent's buffer hold the same bytes), so the device's bracketing of
# its writes is exercised too (vmm/track.c).
start_pool
start_vm vm0 --mem 192M --pool $POOL_SOCK --dedup physical --disk $disk,ro \
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
st=$(pvisor ctl --api-sock /run/vm0.api stats)
say "vm0 plane: merges $(json_field "$st" merges), pages_shared $(json_field "$st" pages_shared), cow_breaks $(json_field "$st" cow_breaks)"
check "the plane merged pages while the disk was read" [ "$(json_field "$st" merges)" -gt 0 ]
vm_cmd vm0 quit
wait_exit vm0 60
check "exit code 0 (got $RC)" [ "$RC" = 0 ]
[ "$fails" = 0 ] || dump_vm vm0 60
finish
