/* virtio.c: the virtio-mmio transport (version 2) and split virtqueues over guest RAM. */
#include <errno.h>
#include <string.h>

#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>
#include <linux/virtio_ring.h>

#include "log.h"
#include "virtio.h"

/* Split ring layout (virtio 1.2, 2.7), little-endian like the x86 host. */
struct vmm_virtq_desc {
	uint64_t addr;   /* buffer gpa */
	uint32_t len;    /* buffer bytes */
	uint16_t flags;  /* VRING_DESC_F_NEXT / _WRITE / _INDIRECT */
	uint16_t next;   /* next descriptor if F_NEXT */
};

struct vmm_virtq_avail {
	uint16_t flags;   /* VRING_AVAIL_F_NO_INTERRUPT */
	uint16_t idx;     /* where the driver puts the next head (free-running) */
	uint16_t ring[];  /* num heads, then used_event */
};

struct vmm_virtq_used_elem {
	uint32_t id;   /* head of the returned chain */
	uint32_t len;  /* bytes the device wrote into it */
};

struct vmm_virtq_used {
	uint16_t flags;  /* VRING_USED_F_NO_NOTIFY (never set here) */
	uint16_t idx;    /* where the device puts the next element (free-running) */
	struct vmm_virtq_used_elem ring[];  /* num elements, then avail_event */
};

#define VMM_VIRTIO_MAGIC      0x74726976u  /* "virt" */
#define VMM_VIRTIO_VENDOR     0x554d4551u  /* "QEMU", what Linux expects of no one in particular */
#define VMM_VIRTIO_LOG_ERRORS 8            /* driver mistakes logged per device, then silence */

void vmm_virtio__guest_error(struct vmm_virtio *v, const char *why)
{
	if (v->guest_errors++ < VMM_VIRTIO_LOG_ERRORS)
		log_warn("virtio (device %u, gsi %u): %s", v->cfg.device_id, v->cfg.gsi, why);
}

/* Raise the line when InterruptStatus goes from 0 to non-zero (level: it stays up). */
static void vmm_virtio_interrupt(struct vmm_virtio *v, uint32_t bits)
{
	bool was = v->isr != 0;

	v->isr |= bits;
	if (!was && v->cfg.set_irq)
		v->cfg.set_irq(v->cfg.irq_opaque, v->cfg.gsi, 1);
}

void vmm_virtio__needs_reset(struct vmm_virtio *v, const char *why)
{
	vmm_virtio__guest_error(v, why);
	if (v->status & VIRTIO_CONFIG_S_NEEDS_RESET)
		return;
	v->status |= VIRTIO_CONFIG_S_NEEDS_RESET;
	/* the spec asks for a config change notification when DRIVER_OK was set */
	if (v->status & VIRTIO_CONFIG_S_DRIVER_OK)
		vmm_virtio_interrupt(v, VIRTIO_MMIO_INT_CONFIG);
}

bool vmm_virtio__live(struct vmm_virtio *v, unsigned q)
{
	return (v->status & VIRTIO_CONFIG_S_DRIVER_OK) &&
	       !(v->status & (VIRTIO_CONFIG_S_NEEDS_RESET | VIRTIO_CONFIG_S_FAILED)) &&
	       q < v->cfg.nqueues && v->vq[q].ready;
}

/* Device reset: registers to their initial values, queues dropped. */
static void vmm_virtio_reset(struct vmm_virtio *v)
{
	/* not live from here on: the device thread pops and pushes nothing more */
	v->status = 0;
	memset(v->vq, 0, sizeof(v->vq));
	if (v->cfg.reset)
		v->cfg.reset(v->cfg.opaque);
	v->drv_features = 0;
	v->dev_features_sel = 0;
	v->drv_features_sel = 0;
	v->queue_sel = 0;
	v->config_gen++;
	if (v->isr && v->cfg.set_irq)
		v->cfg.set_irq(v->cfg.irq_opaque, v->cfg.gsi, 0);
	v->isr = 0;
}

int vmm_virtio__init(struct vmm_virtio *v, const struct vmm_virtio_cfg *cfg)
{
	if (!cfg->mem || !cfg->nqueues || cfg->nqueues > VMM_VIRTIO_MAX_QUEUES ||
	    cfg->config_len > VMM_VIRTIO_MMIO_SIZE - VIRTIO_MMIO_CONFIG)
		return -EINVAL;
	memset(v, 0, sizeof(*v));
	v->cfg = *cfg;
	v->dev_features = cfg->features | (1ull << VIRTIO_F_VERSION_1);
	return -pthread_mutex_init(&v->lock, NULL);
}

void vmm_virtio__fini(struct vmm_virtio *v)
{
	pthread_mutex_destroy(&v->lock);
}

/* Host pointer to a ring part of `len` bytes at gpa, aligned to `align`; NULL if bad. */
static void *vmm_virtq_map(struct vmm_virtio *v, uint64_t gpa, uint64_t len, uint64_t align)
{
	if (gpa & (align - 1))
		return NULL;
	return vmm_mem__hva(v->cfg.mem, GPA(gpa), len);
}

/* QueueReady = 1: check size and addresses once; the ring pointers stay valid after. */
static void vmm_virtq_enable(struct vmm_virtio *v, struct vmm_virtq *vq)
{
	uint64_t n = vq->num;

	if (!n || n > VMM_VIRTQ_NUM_MAX || (n & (n - 1))) {
		vmm_virtio__needs_reset(v, "QueueNum must be a power of 2 in 1..256");
		return;
	}
	vq->desc = vmm_virtq_map(v, vq->desc_gpa, 16 * n, 16);
	vq->avail = vmm_virtq_map(v, vq->avail_gpa, 6 + 2 * n, 2);
	vq->used = vmm_virtq_map(v, vq->used_gpa, 6 + 8 * n, 4);
	if (!vq->desc || !vq->avail || !vq->used) {
		vq->desc = NULL;
		vq->avail = NULL;
		vq->used = NULL;
		vmm_virtio__needs_reset(v, "queue rings misaligned or outside guest RAM");
		return;
	}
	vq->last_avail = 0;
	vq->used_idx = 0;
	vq->ready = true;
}

/* Driver set FEATURES_OK: keep it only if it accepted VERSION_1 and nothing unknown. */
static uint32_t vmm_virtio_features_ok(struct vmm_virtio *v, uint32_t status)
{
	if (!(v->drv_features & (1ull << VIRTIO_F_VERSION_1)) ||
	    (v->drv_features & ~v->dev_features)) {
		vmm_virtio__guest_error(v, "driver features refused (legacy driver or unknown bits)");
		return status & ~VIRTIO_CONFIG_S_FEATURES_OK;
	}
	return status;
}

static void vmm_virtio_write_status(struct vmm_virtio *v, uint32_t val)
{
	if (val == 0) {
		vmm_virtio_reset(v);
		return;
	}
	if ((val & VIRTIO_CONFIG_S_FEATURES_OK) && !(v->status & VIRTIO_CONFIG_S_FEATURES_OK))
		val = vmm_virtio_features_ok(v, val);
	/* the device owns NEEDS_RESET; the driver cannot clear it but by a reset */
	v->status = (val & 0xff & ~VIRTIO_CONFIG_S_NEEDS_RESET) |
		    (v->status & VIRTIO_CONFIG_S_NEEDS_RESET);
}

static uint32_t vmm_virtio_read_reg(struct vmm_virtio *v, uint64_t off)
{
	struct vmm_virtq *vq = v->queue_sel < v->cfg.nqueues ? &v->vq[v->queue_sel] : NULL;

	switch (off) {
	case VIRTIO_MMIO_MAGIC_VALUE:     return VMM_VIRTIO_MAGIC;
	case VIRTIO_MMIO_VERSION:         return 2;
	case VIRTIO_MMIO_DEVICE_ID:       return v->cfg.device_id;
	case VIRTIO_MMIO_VENDOR_ID:       return VMM_VIRTIO_VENDOR;
	case VIRTIO_MMIO_DEVICE_FEATURES:
		return v->dev_features_sel < 2 ? (uint32_t)(v->dev_features >> (32 * v->dev_features_sel)) : 0;
	case VIRTIO_MMIO_QUEUE_NUM_MAX:   return vq ? VMM_VIRTQ_NUM_MAX : 0;
	case VIRTIO_MMIO_QUEUE_READY:     return vq ? vq->ready : 0;
	case VIRTIO_MMIO_INTERRUPT_STATUS: return v->isr;
	case VIRTIO_MMIO_STATUS:          return v->status;
	case VIRTIO_MMIO_SHM_LEN_LOW:     /* no shared memory regions: length ~0 */
	case VIRTIO_MMIO_SHM_LEN_HIGH:    return ~0u;
	case VIRTIO_MMIO_CONFIG_GENERATION: return v->config_gen;
	default:                          return 0;
	}
}

/* Queue registers are writable only while the queue is not ready (spec 4.2.2.2). */
static void vmm_virtio_write_queue(struct vmm_virtio *v, uint64_t off, uint32_t val)
{
	struct vmm_virtq *vq;

	if (v->queue_sel >= v->cfg.nqueues) {
		vmm_virtio__guest_error(v, "queue register write with QueueSel out of range");
		return;
	}
	vq = &v->vq[v->queue_sel];
	if (off == VIRTIO_MMIO_QUEUE_READY) {
		if (!val) {
			/* the device may still hold its buffers; only a reset returns them */
			vq->ready = false;
		} else if (!vq->ready) {
			vmm_virtq_enable(v, vq);
		}
		return;
	}
	if (vq->ready) {
		vmm_virtio__guest_error(v, "queue register written while QueueReady is 1");
		return;
	}
	switch (off) {
	case VIRTIO_MMIO_QUEUE_NUM:       vq->num = val > 0xffff ? 0 : (uint16_t)val; break;
	case VIRTIO_MMIO_QUEUE_DESC_LOW:  vq->desc_gpa = (vq->desc_gpa & ~0xffffffffull) | val; break;
	case VIRTIO_MMIO_QUEUE_DESC_HIGH: vq->desc_gpa = (vq->desc_gpa & 0xffffffffull) | (uint64_t)val << 32; break;
	case VIRTIO_MMIO_QUEUE_AVAIL_LOW: vq->avail_gpa = (vq->avail_gpa & ~0xffffffffull) | val; break;
	case VIRTIO_MMIO_QUEUE_AVAIL_HIGH: vq->avail_gpa = (vq->avail_gpa & 0xffffffffull) | (uint64_t)val << 32; break;
	case VIRTIO_MMIO_QUEUE_USED_LOW:  vq->used_gpa = (vq->used_gpa & ~0xffffffffull) | val; break;
	case VIRTIO_MMIO_QUEUE_USED_HIGH: vq->used_gpa = (vq->used_gpa & 0xffffffffull) | (uint64_t)val << 32; break;
	}
}

static void vmm_virtio_write_features(struct vmm_virtio *v, uint32_t val)
{
	unsigned shift;

	if (v->status & VIRTIO_CONFIG_S_FEATURES_OK) {
		vmm_virtio__guest_error(v, "DriverFeatures written after FEATURES_OK");
		return;
	}
	if (v->drv_features_sel >= 2)
		return;
	shift = 32 * v->drv_features_sel;
	v->drv_features = (v->drv_features & ~(0xffffffffull << shift)) | (uint64_t)val << shift;
}

static void vmm_virtio_write_reg(struct vmm_virtio *v, uint64_t off, uint32_t val)
{
	switch (off) {
	case VIRTIO_MMIO_DEVICE_FEATURES_SEL: v->dev_features_sel = val; break;
	case VIRTIO_MMIO_DRIVER_FEATURES:     vmm_virtio_write_features(v, val); break;
	case VIRTIO_MMIO_DRIVER_FEATURES_SEL: v->drv_features_sel = val; break;
	case VIRTIO_MMIO_QUEUE_SEL:           v->queue_sel = val; break;
	case VIRTIO_MMIO_QUEUE_NUM:
	case VIRTIO_MMIO_QUEUE_READY:
	case VIRTIO_MMIO_QUEUE_DESC_LOW:
	case VIRTIO_MMIO_QUEUE_DESC_HIGH:
	case VIRTIO_MMIO_QUEUE_AVAIL_LOW:
	case VIRTIO_MMIO_QUEUE_AVAIL_HIGH:
	case VIRTIO_MMIO_QUEUE_USED_LOW:
	case VIRTIO_MMIO_QUEUE_USED_HIGH:     vmm_virtio_write_queue(v, off, val); break;
	case VIRTIO_MMIO_QUEUE_NOTIFY:
		if (val < v->cfg.nqueues && vmm_virtio__live(v, val) && v->cfg.notify)
			v->cfg.notify(v->cfg.opaque, val);
		else if (val >= v->cfg.nqueues)
			vmm_virtio__guest_error(v, "QueueNotify for a queue that does not exist");
		break;
	case VIRTIO_MMIO_INTERRUPT_ACK:
		if (v->isr && !(v->isr &= ~val) && v->cfg.set_irq)
			v->cfg.set_irq(v->cfg.irq_opaque, v->cfg.gsi, 0);
		break;
	case VIRTIO_MMIO_STATUS:              vmm_virtio_write_status(v, val); break;
	default:
		vmm_virtio__guest_error(v, "write to a read-only or unknown register");
		break;
	}
}

/* Device config space: any width the driver likes, read-only. */
static void vmm_virtio_config(struct vmm_virtio *v, uint64_t off, uint8_t *data, uint32_t len,
			      bool is_write)
{
	if (is_write) {
		vmm_virtio__guest_error(v, "write to read-only device config");
		return;
	}
	if (off > v->cfg.config_len || len > v->cfg.config_len - off) {
		memset(data, 0, len);
		return;
	}
	memcpy(data, (const uint8_t *)v->cfg.config + off, len);
}

void vmm_virtio__mmio(struct vmm_virtio *v, uint64_t offset, uint8_t *data, uint32_t len,
		      bool is_write)
{
	uint32_t val;

	if (!len || len > 8 || offset >= VMM_VIRTIO_MMIO_SIZE || len > VMM_VIRTIO_MMIO_SIZE - offset) {
		if (!is_write && len <= 8)
			memset(data, 0, len);
		return;
	}
	pthread_mutex_lock(&v->lock);
	if (offset >= VIRTIO_MMIO_CONFIG) {
		vmm_virtio_config(v, offset - VIRTIO_MMIO_CONFIG, data, len, is_write);
	} else if (len != 4 || (offset & 3)) {
		/* registers are 32-bit only (spec 4.2.2.1) */
		vmm_virtio__guest_error(v, "register access that is not 32-bit aligned");
		if (!is_write)
			memset(data, 0, len);
	} else if (is_write) {
		memcpy(&val, data, 4);
		vmm_virtio_write_reg(v, offset, val);
	} else {
		val = vmm_virtio_read_reg(v, offset);
		memcpy(data, &val, 4);
	}
	pthread_mutex_unlock(&v->lock);
}

/* Read descriptor i once (the guest may change it under us) and check its buffer. */
static int vmm_virtq_read_desc(struct vmm_virtio *v, struct vmm_virtq *vq, uint16_t i,
			       struct vmm_virtq_seg *s, uint16_t *flags, uint16_t *next)
{
	const volatile struct vmm_virtq_desc *d = &vq->desc[i];
	uint64_t addr = d->addr;

	s->len = d->len;
	*flags = d->flags;
	*next = d->next;
	if (*flags & VRING_DESC_F_INDIRECT)
		return -EINVAL; /* never offered */
	s->gpa = GPA(addr);
	s->write = *flags & VRING_DESC_F_WRITE;
	s->hva = vmm_mem__hva(v->cfg.mem, s->gpa, s->len);
	return 0;
}

/* Walk the chain from head; every step checked, at most VMM_VIRTQ_MAX_CHAIN steps. */
static int vmm_virtq_walk(struct vmm_virtio *v, struct vmm_virtq *vq, uint16_t head,
			  struct vmm_virtq_chain *c)
{
	uint16_t i = head, flags, next;
	struct vmm_virtq_seg *s;

	c->head = head;
	c->nseg = 0;
	c->nread = 0;
	c->bad = false;
	for (;;) {
		if (i >= vq->num)
			return -EINVAL;
		if (c->nseg == VMM_VIRTQ_MAX_CHAIN || c->nseg == vq->num)
			return -ELOOP; /* a loop, or longer than any chain we accept */
		s = &c->seg[c->nseg++];
		if (vmm_virtq_read_desc(v, vq, i, s, &flags, &next))
			return -EINVAL;
		if (!s->hva)
			c->bad = true;
		if (!s->write) {
			if (c->nread != c->nseg - 1)
				c->bad = true; /* readable after writable */
			else
				c->nread++;
		}
		if (!(flags & VRING_DESC_F_NEXT))
			return 0;
		i = next;
	}
}

int vmm_virtq__pop(struct vmm_virtio *v, unsigned q, struct vmm_virtq_chain *c)
{
	struct vmm_virtq *vq = &v->vq[q];
	uint16_t avail_idx, head;
	int err;

	if (!vmm_virtio__live(v, q))
		return 0;
	avail_idx = __atomic_load_n(&vq->avail->idx, __ATOMIC_ACQUIRE);
	if (avail_idx == vq->last_avail)
		return 0;
	if ((uint16_t)(avail_idx - vq->last_avail) > vq->num) {
		vmm_virtio__needs_reset(v, "avail index moved more than QueueNum ahead");
		return -EINVAL;
	}
	head = __atomic_load_n(&vq->avail->ring[vq->last_avail % vq->num], __ATOMIC_RELAXED);
	if (head >= vq->num) {
		vmm_virtio__needs_reset(v, "avail ring head beyond QueueNum");
		return -EINVAL;
	}
	err = vmm_virtq_walk(v, vq, head, c);
	if (err) {
		vmm_virtio__needs_reset(v, err == -ELOOP ? "descriptor chain loops or is too long"
					 : "descriptor next beyond QueueNum or INDIRECT");
		return -EINVAL;
	}
	vq->last_avail++;
	return 1;
}

void vmm_virtq__push(struct vmm_virtio *v, unsigned q, uint16_t head, uint32_t len)
{
	struct vmm_virtq *vq = &v->vq[q];
	struct vmm_virtq_used_elem *e;
	uint16_t flags;

	if (q >= v->cfg.nqueues || !vq->ready)
		return; /* reset or disabled meanwhile: nobody is waiting for it */
	e = &vq->used->ring[vq->used_idx % vq->num];
	__atomic_store_n(&e->id, head, __ATOMIC_RELAXED);
	__atomic_store_n(&e->len, len, __ATOMIC_RELAXED);
	vq->used_idx++;
	__atomic_store_n(&vq->used->idx, vq->used_idx, __ATOMIC_RELEASE);
	/* the used index must be visible before we read the driver's suppression flag */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	flags = __atomic_load_n(&vq->avail->flags, __ATOMIC_RELAXED);
	if (!(flags & VRING_AVAIL_F_NO_INTERRUPT))
		vmm_virtio_interrupt(v, VIRTIO_MMIO_INT_VRING);
}
