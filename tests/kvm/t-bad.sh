# t-bad.sh: a kernel that is not a bzImage and a guest that triple-faults end with a clear error (issue 4, test 5).
T=kvm-bad
. /tests/lib.sh

# 1. Not a bzImage: the busybox binary.
pvisor run --guest kvm --kernel /bin/busybox --mem 64M --dedup off </dev/null >/tmp/nb.out 2>/tmp/nb.err
rc=$?
cat /tmp/nb.err
check "not-a-bzImage: non-zero exit (got $rc)" [ "$rc" != 0 ]
check "not-a-bzImage: the error names the file and says bzImage" grep -q "busybox.*bzImage\|bzImage.*busybox" /tmp/nb.err

# 2. A bzImage-shaped file whose 64-bit entry loads an empty IDT and executes ud2:
# the #UD cannot be delivered, nor the #DF, so the CPU triple-faults.
f=/tmp/triple.bzImage
dd if=/dev/zero of=$f bs=512 count=8 2>/dev/null
put() { printf "$2" | dd of=$f bs=1 seek=$(($1)) conv=notrunc 2>/dev/null; }
put 0x1f1 '\001'                   # setup_sects: 1 (+ boot sector) = 1024 bytes of setup
put 0x1fe '\125\252'               # boot_flag 0xaa55
put 0x200 '\353\146'               # jmp over the header: it ends at 0x268
put 0x202 'HdrS'                   # header magic
put 0x206 '\017\002'               # protocol 2.15
put 0x211 '\001'                   # loadflags: LOADED_HIGH
# (the file is zeros already: write only the non-zero bytes; busybox printf ends at a NUL)
put 0x232 '\040'                   # kernel_alignment 0x200000 (2 MiB)
put 0x234 '\001'                   # relocatable_kernel: load it at 1 MiB
put 0x236 '\001\000'               # xloadflags: XLF_KERNEL_64
put 0x239 '\010'                   # cmdline_size 0x800
put 0x262 '\020'                   # init_size 0x100000 (1 MiB)
# 64-bit entry = protected-mode kernel (file offset 1024) + 0x200:
# push 0; push 0; lidt [rsp]; ud2
put $((1024 + 0x200)) '\152'; put $((1024 + 0x202)) '\152'
put $((1024 + 0x204)) '\017\001\034\044\017\013'
t0=$(uptime_s)
pvisor run --guest kvm --kernel $f --mem 64M --dedup off </dev/null >/tmp/tf.out 2>/tmp/tf.err &
pid=$!
end=$(deadline 30); while kill -0 $pid 2>/dev/null && before $end; do sleep 0.1; done
kill -0 $pid 2>/dev/null && { kill -9 $pid; fail "triple fault: pvisor still running after 30 s"; }
wait $pid; rc=$?
cat /tmp/tf.err
check "triple fault: non-zero exit (got $rc)" [ "$rc" != 0 ] && [ "$rc" != 137 ]
check "triple fault: the error says so" grep -q "triple fault (KVM_EXIT_SHUTDOWN)" /tmp/tf.err
sleep 0.2
pidof pvisor >/dev/null && fail "a pvisor process is still running" || ok "nothing left running"

# 3. Missing files: an error naming the file, before anything starts.
pvisor run --guest kvm --kernel /nonexistent --mem 64M --dedup off </dev/null 2>/tmp/nf.err
rc=$?
cat /tmp/nf.err
check "missing kernel: non-zero exit (got $rc)" [ "$rc" != 0 ]
check "missing kernel: the error names the file" grep -q "/nonexistent" /tmp/nf.err
finish
