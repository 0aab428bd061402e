/* ctl.h: `pvisor ctl`, the command-line client of a running VM's API socket. */
#ifndef PVISOR_VMM_CTL_H
#define PVISOR_VMM_CTL_H

/*
 * Run `pvisor ctl` with argv[0] = "ctl". Returns the exit status: 0 if the
 * reply says "ok": true, 1 if false (or wait-ready timed out), 2 for a usage
 * error or when the socket cannot be reached.
 */
int vmm_ctl__main(int argc, char **argv);

/* The ctl section of `pvisor --help`. */
void vmm_ctl__usage(void);

#endif
