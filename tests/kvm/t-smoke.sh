# t-smoke.sh (runs inside the outer guest): /dev/kvm works and pvisor starts.
ls -l /dev/kvm || exit 1
pvisor --version || exit 1
pvisor-pool --help >/dev/null 2>&1; echo "pool help rc=$?"
exit 0
