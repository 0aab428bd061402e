#!/bin/bash
# t-errors.sh: bad flags, values and files make `pvisor run` exit 2 naming the flag and what is allowed.
. "$(dirname "$0")/lib.sh"
t_setup

S="--guest synthetic --dedup off"
t_expect 2 "unknown flag '--bogus'&&known: .*mem" run --bogus 1
t_expect 2 "unknown flag '--frobnicate'" run $S --frobnicate=3
t_expect 2 "--dedup&&physical\|ksm\|off" run --dedup fast
t_expect 2 "--guest&&kvm\|synthetic" run --guest qemu
t_expect 2 "--workload&&repeated\|shared-random\|unique-random\|zeros\|patterns\|none" run $S --workload lots
t_expect 2 "--mem&&bad size '12Q'&&K, M, G or T" run $S --mem 12Q
t_expect 2 "--mem&&multiple of 4 KiB" run $S --mem 1048577
t_expect 2 "--data-size&&bad size" run $S --data-size=-5M
t_expect 2 "--data-size&&do not fit in --mem" run $S --mem 64M --data-size 128M --workload zeros
t_expect 2 "--dedup-cpu&&out of range \(1\.\.100\)" run $S --dedup-cpu 0
t_expect 2 "--dedup-cpu&&out of range" run $S --dedup-cpu 101
t_expect 2 "--vcpus&&bad number" run $S --vcpus two
t_expect 2 "--seed&&bad number" run $S --seed -1
t_expect 2 "--log-level&&error\|warn\|info\|debug" run $S --log-level loud
t_expect 2 "--domain&&A-Z a-z 0-9" run $S --domain 'a b'
t_expect 2 "--kernel.*need --guest kvm" run $S --kernel /boot/vmlinuz
t_expect 2 "--mem needs a value" run $S --mem
t_expect 2 "unexpected argument 'extra'" run $S extra
t_expect 2 "unknown command 'fly'" fly
t_expect 2 "usage: pvisor run"

# Config files: same keys, errors name file:line and the key.
printf 'mem = 64M\n# a comment\n\ndedup = turbo\n' >"$T_TMP/bad-value.conf"
t_expect 2 "bad-value\.conf:4:&&'dedup'&&physical\|ksm\|off" run $S --config "$T_TMP/bad-value.conf"
printf 'mem = 64M\nmemory = 1G\n' >"$T_TMP/bad-key.conf"
t_expect 2 "bad-key\.conf:2:&&unknown key 'memory'" run $S --config "$T_TMP/bad-key.conf"
printf 'just words\n' >"$T_TMP/bad-line.conf"
t_expect 2 "bad-line\.conf:1:&&key = value" run $S --config "$T_TMP/bad-line.conf"
printf 'config = /etc/other.conf\n' >"$T_TMP/bad-config.conf"
t_expect 2 "bad-config\.conf:1:&&command line" run $S --config "$T_TMP/bad-config.conf"
t_expect 2 "nonexistent\.conf&&cannot open" run $S --config "$T_TMP/nonexistent.conf"

# KVM: without /dev/kvm the hint points at the synthetic guest; with it, a KVM guest needs a kernel.
if [ -e /dev/kvm ]; then
	t_expect nonzero "--kernel" run --guest kvm --dedup off
	t_expect nonzero "/nonexistent" run --guest kvm --dedup off --kernel /nonexistent
else
	t_expect nonzero "no /dev/kvm&&--guest synthetic" run
	t_expect nonzero "no /dev/kvm&&--guest synthetic" run --guest kvm --dedup off --kernel /nonexistent
fi

# Help lists every flag with its default and says what the synthetic guest is.
t_expect 0 "--mem SIZE.*default: 256M&&--dedup-cpu.*default: 50&&--workload.*default: none&&benchmarks and tests of the memory plane&&--name.*vm-<pid>" run --help
t_expect 0 "pvisor run&&pvisor ctl&&wait-ready" --help

# ctl usage errors exit 2, an absent socket too (naming it and the errno).
t_expect 2 "--api-sock PATH is required" ctl stats
t_expect 2 "no command given" ctl --api-sock "$T_TMP/x.sock"
t_expect 2 "unknown flag '--bogus'" ctl --bogus --api-sock "$T_TMP/x.sock" stats
t_expect 2 "cannot connect to API socket $T_TMP/none\.sock&&No such file" ctl --api-sock "$T_TMP/none.sock" stats
t_expect 2 "--timeout needs a number" ctl --api-sock "$T_TMP/x.sock" wait-ready --timeout soon
t_expect 1 "did not become ready within 0\.3 s&&No such file" ctl --api-sock "$T_TMP/none.sock" wait-ready --timeout 0.3

t_pass
