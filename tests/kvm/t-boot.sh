# t-boot.sh: a Linux guest on pvisor's KVM backend boots to its init and powers off (issue 4, test 1).
T=kvm-boot
. /tests/lib.sh

# 2 vCPUs, no pool: the boot path alone. The guest's init prints PVG-INIT, the agent
# reports, and pvg.exit=poweroff ends the VMM through the ACPI sleep register.
start_vm vm0 --mem 256M --vcpus 2 --dedup off --cmdline "pvg.workload=repeated pvg.size=4M pvg.exit=poweroff"
wait_exit vm0 240
check "guest powered off, pvisor exit code 0 (got $RC)" [ "$RC" = 0 ]
check "kernel console output arrived" grep -q "Linux version" /tmp/vm0.out
check "guest reached its init" grep -q "PVG-INIT" /tmp/vm0.out
check "guest saw 2 CPUs" grep -q "Brought up 1 node, 2 CPUs" /tmp/vm0.out
line=$(pvg_event vm0 ready 1)
check "agent reported ready with 0 mismatches" [ "$(json_field "$line" verify_mismatched)" = 0 ]
pidof pvisor >/dev/null && fail "a pvisor process is still running" || ok "nothing left running"

# Reboot ends the VMM with 0 too.
start_vm vm1 --mem 128M --dedup off --cmdline "pvg.exit=reboot"
wait_exit vm1 240
check "guest rebooted, pvisor exit code 0 (got $RC)" [ "$RC" = 0 ]
[ "$fails" = 0 ] || { dump_vm vm0 60; dump_vm vm1; }
finish
