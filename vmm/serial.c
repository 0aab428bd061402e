/* serial.c: a 16550A UART (COM1) for the guest console: output to a host fd, input from one. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <termios.h>
#include <unistd.h>

#include "log.h"
#include "serial.h"

/*
 * DOC: the UART model
 *
 * Enough of a 16550A for Linux's 8250 driver. Transmission is instant: a byte
 * written to THR goes straight to out_fd, so THR and the shift register are
 * always empty (LSR THRE|TEMT). Interrupts are level-style: the line is high
 * while an enabled condition holds (received data with IER.RDI, an empty
 * transmitter with IER.THRI) and low otherwise, and is only driven when that
 * changes. The IOAPIC pin is edge-triggered (ISA IRQ 4), so each rise is one
 * interrupt; Linux's handler loops until IIR says "no interrupt" (it drains its
 * buffer, then clears IER.THRI), which drops the line and re-arms the edge.
 *
 * Input: a thread polls in_fd and appends to rx[]; when rx[] is full it waits
 * until the guest reads. EOF (a pipe closed, /dev/null) ends polling of in_fd
 * for good, so it never spins.
 */

#define UART_RBR 0   /* read: receive buffer; write: THR; DLAB: divisor low */
#define UART_IER 1   /* DLAB: divisor high */
#define UART_IIR 2   /* read: interrupt identification; write: FCR */
#define UART_LCR 3
#define UART_MCR 4
#define UART_LSR 5
#define UART_MSR 6
#define UART_SCR 7

#define IER_RDI      0x01
#define IER_THRI     0x02
#define IIR_NO_INT   0x01
#define IIR_THRI     0x02
#define IIR_RDI      0x04
#define IIR_FIFO     0xc0
#define FCR_ENABLE   0x01
#define FCR_CLEAR_RX 0x02
#define LCR_DLAB     0x80
#define MCR_LOOP     0x10
#define LSR_DR       0x01
#define LSR_THRE     0x20
#define LSR_TEMT     0x40
#define MSR_DEFAULT  0xb0   /* DCD, DSR, CTS: a modem that is always there */

#define SERIAL_RX_MAX 4096
#define CTRL_A        0x01

/* struct vmm_serial - the UART's registers, its input buffer and the input thread */
struct vmm_serial {
	struct vmm_serial_cfg cfg;
	pthread_mutex_t lock;      /* registers and rx[]: vCPU threads and the input thread */
	pthread_cond_t room;       /* rx[] has room again */
	uint8_t ier, lcr, mcr, fcr, scr, dll, dlm;
	bool irq_high;             /* the level last driven on the line */
	uint8_t rx[SERIAL_RX_MAX]; /* received bytes not yet read by the guest */
	size_t rx_head, rx_len;    /* ring: oldest byte at rx_head */
	bool out_broken;           /* out_fd failed once: drop output, say it once */
	int wake_fd;               /* eventfd: stop the input thread */
	bool stopping;
	pthread_t thread;
	bool thread_started;
};

/* The terminal as we found it, restored at exit even if main() dies. */
static struct termios serial_saved_tty;
static int serial_tty_fd = -1;

static void serial_tty_restore(void)
{
	if (serial_tty_fd >= 0)
		tcsetattr(serial_tty_fd, TCSANOW, &serial_saved_tty);
	serial_tty_fd = -1;
}

static void serial_tty_raw(int fd)
{
	static bool registered;
	struct termios t;

	if (!isatty(fd) || tcgetattr(fd, &serial_saved_tty))
		return;
	t = serial_saved_tty;
	t.c_iflag &= ~(tcflag_t)(IGNBRK | BRKINT | PARMRK | ISTRIP | INLCR | IGNCR | ICRNL | IXON);
	t.c_lflag &= ~(tcflag_t)(ECHO | ECHONL | ICANON | ISIG | IEXTEN);
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 0;
	if (tcsetattr(fd, TCSANOW, &t))
		return;
	serial_tty_fd = fd;
	if (!registered)
		atexit(serial_tty_restore);
	registered = true;
}

/* Recompute IIR and drive the line if its level changed. Called with lock held. */
static uint8_t serial_update_irq(struct vmm_serial *s)
{
	uint8_t iir = IIR_NO_INT;

	if ((s->ier & IER_RDI) && s->rx_len)
		iir = IIR_RDI;
	else if (s->ier & IER_THRI)
		iir = IIR_THRI;   /* the transmitter is always empty */
	if ((iir != IIR_NO_INT) != s->irq_high) {
		s->irq_high = iir != IIR_NO_INT;
		s->cfg.set_irq(s->cfg.irq_opaque, s->cfg.gsi, s->irq_high);
	}
	return iir;
}

static void serial_out(struct vmm_serial *s, uint8_t c)
{
	for (;;) {
		ssize_t n = write(s->cfg.out_fd, &c, 1);

		if (n == 1)
			return;
		if (n < 0 && errno == EINTR)
			continue;
		if (!s->out_broken)
			log_warn("serial: console output failed (%s); dropping the rest",
				 n < 0 ? strerror(errno) : "short write");
		s->out_broken = true;
		return;
	}
}

static uint8_t serial_rx_pop(struct vmm_serial *s)
{
	uint8_t c;

	if (!s->rx_len)
		return 0;
	c = s->rx[s->rx_head];
	s->rx_head = (s->rx_head + 1) % SERIAL_RX_MAX;
	if (s->rx_len-- == SERIAL_RX_MAX)
		pthread_cond_signal(&s->room);
	return c;
}

static void serial_write(struct vmm_serial *s, unsigned reg, uint8_t v)
{
	switch (reg) {
	case UART_RBR:
		if (s->lcr & LCR_DLAB)
			s->dll = v;
		else if (!(s->mcr & MCR_LOOP) && !s->out_broken)
			serial_out(s, v);
		break;
	case UART_IER:
		if (s->lcr & LCR_DLAB)
			s->dlm = v;
		else
			s->ier = v & 0x0f;
		break;
	case UART_IIR:
		s->fcr = v;
		if (v & FCR_CLEAR_RX) {
			s->rx_head = s->rx_len = 0;
			pthread_cond_signal(&s->room);
		}
		break;
	case UART_LCR:
		s->lcr = v;
		break;
	case UART_MCR:
		s->mcr = v;
		break;
	case UART_SCR:
		s->scr = v;
		break;
	default:          /* LSR, MSR: read-only (factory test) */
		break;
	}
}

static uint8_t serial_read(struct vmm_serial *s, unsigned reg)
{
	switch (reg) {
	case UART_RBR:
		return (s->lcr & LCR_DLAB) ? s->dll : serial_rx_pop(s);
	case UART_IER:
		return (s->lcr & LCR_DLAB) ? s->dlm : s->ier;
	case UART_IIR:
		return serial_update_irq(s) | ((s->fcr & FCR_ENABLE) ? IIR_FIFO : 0);
	case UART_LCR:
		return s->lcr;
	case UART_MCR:
		return s->mcr;
	case UART_LSR:
		return LSR_THRE | LSR_TEMT | (s->rx_len ? LSR_DR : 0);
	case UART_MSR:
		if (s->mcr & MCR_LOOP) /* DTR->DSR, RTS->CTS, OUT1->RI, OUT2->DCD */
			return (uint8_t)(((s->mcr & 0x01) << 5) | ((s->mcr & 0x02) << 3) |
					 ((s->mcr & 0x04) << 4) | ((s->mcr & 0x08) << 4));
		return MSR_DEFAULT;
	default:
		return s->scr;
	}
}

void vmm_serial__io(void *opaque, uint64_t offset, uint8_t *data, uint32_t len, bool is_write)
{
	struct vmm_serial *s = opaque;

	if (offset >= VMM_SERIAL_PORTS)
		return;
	pthread_mutex_lock(&s->lock);
	if (is_write) {
		serial_write(s, (unsigned)offset, data[0]);
	} else {
		memset(data, 0, len);
		data[0] = serial_read(s, (unsigned)offset);
	}
	serial_update_irq(s);
	pthread_mutex_unlock(&s->lock);
}

/* Queue received bytes (the caller made sure they fit) and interrupt if enabled. */
static void serial_rx_push(struct vmm_serial *s, const uint8_t *buf, size_t n)
{
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n && s->rx_len < SERIAL_RX_MAX; i++)
		s->rx[(s->rx_head + s->rx_len++) % SERIAL_RX_MAX] = buf[i];
	serial_update_irq(s);
	pthread_mutex_unlock(&s->lock);
}

/* Strip the Ctrl-A escapes of a terminal in place; returns the bytes left for the guest. */
static size_t serial_escapes(struct vmm_serial *s, uint8_t *buf, size_t n, bool *escape)
{
	size_t out = 0;

	for (size_t i = 0; i < n; i++) {
		uint8_t c = buf[i];

		if (*escape) {
			*escape = false;
			if (c == 'x' && s->cfg.quit_fd >= 0) {
				uint64_t one = 1;

				log_info("serial: Ctrl-A x: stopping the VM");
				if (write(s->cfg.quit_fd, &one, sizeof(one)) != sizeof(one))
					log_err("serial: cannot signal quit: %s", strerror(errno));
			} else if (c == CTRL_A) {
				buf[out++] = c;
			}
			continue;
		}
		if (c == CTRL_A)
			*escape = true;
		else
			buf[out++] = c;
	}
	return out;
}

/* Free room in rx[], waiting for the guest to read when it is full; 0 when stopping. */
static size_t serial_wait_room(struct vmm_serial *s)
{
	size_t room;

	pthread_mutex_lock(&s->lock);
	while (s->rx_len == SERIAL_RX_MAX && !s->stopping)
		pthread_cond_wait(&s->room, &s->lock);
	room = s->stopping ? 0 : SERIAL_RX_MAX - s->rx_len;
	pthread_mutex_unlock(&s->lock);
	return room;
}

static void *serial_input_thread(void *arg)
{
	struct vmm_serial *s = arg;
	bool tty = isatty(s->cfg.in_fd), eof = false, escape = false;
	uint8_t buf[256];

	for (;;) {
		struct pollfd p[2] = { { .fd = s->wake_fd, .events = POLLIN },
				       { .fd = s->cfg.in_fd, .events = POLLIN } };
		size_t room = serial_wait_room(s);
		ssize_t n;

		if (!room)
			break;
		if (poll(p, eof ? 1 : 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_err("serial: poll: %s", strerror(errno));
			break;
		}
		if (p[0].revents)
			break;
		if (!p[1].revents)
			continue;
		n = read(s->cfg.in_fd, buf, room < sizeof(buf) ? room : sizeof(buf));
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0) {
			log_debug("serial: console input ended (%s)", n ? strerror(errno) : "EOF");
			eof = true;   /* keep serving the wake fd only */
			continue;
		}
		if (tty)
			n = (ssize_t)serial_escapes(s, buf, (size_t)n, &escape);
		serial_rx_push(s, buf, (size_t)n);
	}
	return NULL;
}

int vmm_serial__create(struct vmm_serial **out, const struct vmm_serial_cfg *cfg)
{
	struct vmm_serial *s;
	int ret;

	if (!cfg->set_irq)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->wake_fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->room, NULL);
	s->cfg.set_irq(s->cfg.irq_opaque, s->cfg.gsi, 0);
	if (cfg->in_fd >= 0) {
		s->wake_fd = eventfd(0, EFD_CLOEXEC);
		if (s->wake_fd < 0) {
			ret = -errno;
			goto err;
		}
		serial_tty_raw(cfg->in_fd);
		ret = -pthread_create(&s->thread, NULL, serial_input_thread, s);
		if (ret)
			goto err;
		s->thread_started = true;
		pthread_setname_np(s->thread, "serial-in");
	}
	*out = s;
	return 0;
err:
	vmm_serial__destroy(s);
	return ret;
}

void vmm_serial__destroy(struct vmm_serial *s)
{
	uint64_t one = 1;

	if (!s)
		return;
	if (s->thread_started) {
		pthread_mutex_lock(&s->lock);
		s->stopping = true;
		pthread_cond_signal(&s->room);
		pthread_mutex_unlock(&s->lock);
		if (write(s->wake_fd, &one, sizeof(one)) != sizeof(one))
			log_err("serial: cannot stop the input thread: %s", strerror(errno));
		pthread_join(s->thread, NULL);
	}
	serial_tty_restore();
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	pthread_cond_destroy(&s->room);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
