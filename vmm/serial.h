/* serial.h: a 16550A UART (COM1) for the guest console: output to a host fd, input from one. */
#ifndef PVISOR_VMM_SERIAL_H
#define PVISOR_VMM_SERIAL_H

#include <stdbool.h>
#include <stdint.h>

struct vmm_serial; /* opaque */

#define VMM_SERIAL_COM1_PORT 0x3f8
#define VMM_SERIAL_COM1_GSI  4
#define VMM_SERIAL_PORTS     8   /* registers at port .. port + 7 */

/* struct vmm_serial_cfg - where the console goes and how it interrupts */
struct vmm_serial_cfg {
	int out_fd;       /* guest output, written unbuffered (stdout) */
	int in_fd;        /* guest input read by a thread (stdin); -1 for none */
	int quit_fd;      /* eventfd written on Ctrl-A x from a terminal; -1 to disable */
	uint32_t gsi;     /* interrupt line, raised while an enabled interrupt is pending */
	/* raise (level=1) or lower (level=0) the line; called under the UART's lock */
	void (*set_irq)(void *opaque, uint32_t gsi, int level);
	void *irq_opaque;
};

/*
 * Create the UART and start its input thread. When in_fd is a terminal it is
 * put in raw mode (Ctrl-A x quits, Ctrl-A Ctrl-A sends Ctrl-A) and restored by
 * vmm_serial__destroy or at exit(). Returns 0 or -errno.
 */
int vmm_serial__create(struct vmm_serial **out, const struct vmm_serial_cfg *cfg);
/* The port handler for the 8 registers (a vmm_io_fn; opaque = struct vmm_serial *). */
void vmm_serial__io(void *opaque, uint64_t offset, uint8_t *data, uint32_t len, bool is_write);
/* Stop the input thread, restore the terminal, free. NULL is fine. */
void vmm_serial__destroy(struct vmm_serial *s);

#endif
