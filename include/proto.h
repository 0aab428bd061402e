/* proto.h: the pool<->vmm protocol, the whole contract between pool/ and vmm/. */
#ifndef PVISOR_PROTO_H
#define PVISOR_PROTO_H

/*
 * DOC: how a VMM and pvisor-pool talk
 *
 * Control: one SOCK_SEQPACKET Unix socket per client. Every message starts
 * with struct proto_hdr. The client speaks first (HELLO); the pool answers
 * every request with exactly one reply and never sends anything unsolicited
 * on this socket, so a client can treat it as request/response.
 *
 *   HELLO        -> HELLO_REPLY + fds [ring memfd, submit eventfd, complete eventfd]
 *   SEG_REQ      -> SEG_REPLY + fd [segment memfd, sealed, map it MAP_PRIVATE]
 *   STAT_REQ     -> STAT_REPLY (JSON text; PROTO_STAT_MORE set on all but the last)
 *
 * Data: one shared memfd per client (struct proto_ring_hdr at offset 0), with
 * a submission ring (client -> pool), a completion ring (pool -> client) and
 * staging slots, each PROTO_PAGE_SIZE bytes, for uploads. Everything in that
 * memfd can be written by the client at any time, so the pool copies an entry
 * out before it looks at it and never trusts the header after it built it.
 *
 * Doorbells: the client writes 1 to the submit eventfd when the submission
 * ring goes from empty to non-empty; the pool does the same with the complete
 * eventfd. A reader drains its ring completely after every wakeup.
 *
 * A page travels like this (the two phases of mm/ksm.c's unstable and stable
 * trees, driven by hashes instead of tree walks):
 *
 *   OFFER(page, hash)  first time the pool sees the hash in this domain: it
 *                      remembers (client, page) as a candidate, answers
 *                      nothing, and stores nothing.
 *   OFFER(page, hash)  hash already stable: MAP(page, seg, slot); the pool
 *                      took one reference on the slot for this client.
 *   OFFER(page, hash)  hash is a candidate of another page: UPLOAD(page).
 *   UPLOAD(page, hash, staging)
 *                      the client copied the page into a staging slot; the
 *                      pool copies it into the store, hashes its own copy,
 *                      and answers MAP to the uploader and to every waiting
 *                      candidate, or MISMATCH if the bytes do not hash to the
 *                      claimed hash. Either way the staging slot is free again
 *                      once the completion naming it arrives.
 *   DROP(page, seg, slot)
 *                      the client no longer maps the slot at that page
 *                      (copy-on-write, failed compare, guest reset): the pool
 *                      drops that client's reference. A client can only drop
 *                      references it holds.
 *   FORGET(page)       the page changed: forget any candidate for it.
 *   ZERO(page)         the client discarded an all-zero page (stats only).
 *
 * A MAP verdict is advice, not a command: the client compares all 4096 bytes
 * under write protection before it remaps and sends DROP if they differ.
 */

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_MAGIC         0x504d5650u /* "PVMP" little endian */
#define PROTO_RING_MAGIC    0x47525650u /* "PVRG" */
#define PROTO_VERSION       1
#define PROTO_PAGE_SHIFT    12
#define PROTO_PAGE_SIZE     (1u << PROTO_PAGE_SHIFT)
#define PROTO_DOMAIN_MAX    32          /* bytes, including the NUL */
#define PROTO_MSG_MAX       65536       /* largest control message */
#define PROTO_MAX_GUEST_PAGES (1ull << 28) /* 1 TiB of guest RAM */
#define PROTO_NO_STAGING    0xffffffffu

/* Default shape of a client's rings; the pool decides and reports it. */
#define PROTO_SQ_ENTRIES    2048
#define PROTO_CQ_ENTRIES    4096
#define PROTO_STAGING_SLOTS 64 

enum proto_msg_type {
	PROTO_MSG_HELLO       = 1,
	PROTO_MSG_HELLO_REPLY = 2,
	PROTO_MSG_SEG_REQ     = 3,
	PROTO_MSG_SEG_REPLY   = 4,
	PROTO_MSG_STAT_REQ    = 5,
	PROTO_MSG_STAT_REPLY  = 6,
};

/* struct proto_hdr - first bytes of every control message */
struct proto_hdr {
	uint32_t magic;   /* PROTO_MAGIC */
	uint16_t version; /* PROTO_VERSION; the pool refuses any other */
	uint16_t type;    /* enum proto_msg_type */
	uint32_t len;     /* whole message length in bytes, header included */
	uint32_t flags;   /* per type; PROTO_STAT_* for stats */
};

/* Fill the header of a control message of @len bytes (the one way both sides build it). */
static inline void proto_hdr_init(struct proto_hdr *h, uint16_t type, uint32_t len, uint32_t flags)
{
	*h = (struct proto_hdr){ .magic = PROTO_MAGIC, .version = PROTO_VERSION, .type = type,
				 .len = len, .flags = flags };
}

/* struct proto_hello - a VMM introduces itself */
struct proto_hello {
	struct proto_hdr hdr;
	char domain[PROTO_DOMAIN_MAX]; /* sharing domain, NUL terminated, [A-Za-z0-9_.-] */
	char name[PROTO_DOMAIN_MAX];   /* client's name for stats, NUL terminated */
	uint64_t guest_pages;          /* guest RAM in pages, <= PROTO_MAX_GUEST_PAGES */
};

/* struct proto_hello_reply - the pool accepts (status 0) or refuses (-errno) */
struct proto_hello_reply {
	struct proto_hdr hdr;
	int32_t status;        /* 0, or -errno: -EPROTO bad version, -EINVAL bad field */
	uint32_t client_id;    /* pool's id for this client, for stats */
	uint32_t seg_pages;    /* pages per store segment */
	uint32_t reserved;
	uint64_t ring_size;    /* bytes of the ring memfd */
	char message[64];      /* human-readable reason when status != 0 */
};

/* struct proto_seg_req - ask for the fd of a store segment */
struct proto_seg_req {
	struct proto_hdr hdr;
	uint32_t seg;          /* segment id, as named in a MAP verdict */
	uint32_t reserved;
};

/* struct proto_seg_reply - one sealed segment memfd rides along (SCM_RIGHTS) */
struct proto_seg_reply {
	struct proto_hdr hdr;
	int32_t status;        /* 0 with an fd, or -errno without */
	uint32_t seg;
	uint64_t pages;        /* size of the segment in pages */
};

#define PROTO_STAT_JSON  0x1u /* request: reply carries JSON (the only format) */
#define PROTO_STAT_AUDIT 0x2u /* request: rehash every slot and report mismatches */
#define PROTO_STAT_MORE  0x1u /* reply: more STAT_REPLY messages follow */

/* struct proto_stat_req - ask for statistics (any peer may, it takes no client slot) */
struct proto_stat_req {
	struct proto_hdr hdr;
};

/* A STAT_REPLY is a proto_hdr followed by (len - sizeof hdr) bytes of JSON text. */

/* --- the shared ring memfd ------------------------------------------------ */

/* struct proto_ring_idx - one ring's indices, each on its own cache line */
struct proto_ring_idx {
	uint32_t head;        /* consumer's position, free-running */
	uint8_t pad0[60];
	uint32_t tail;        /* producer's position, free-running */
	uint8_t pad1[60];
};

/* struct proto_ring_hdr - offset 0 of the ring memfd, written once by the pool */
struct proto_ring_hdr {
	uint32_t magic;          /* PROTO_RING_MAGIC */
	uint32_t version;        /* PROTO_VERSION */
	uint32_t sq_entries;     /* power of two */
	uint32_t cq_entries;     /* power of two */
	uint32_t staging_slots;  /* number of PROTO_PAGE_SIZE staging slots */
	uint32_t reserved;
	uint64_t sq_off;         /* struct proto_ring_idx, then sq_entries proto_sqe */
	uint64_t cq_off;         /* struct proto_ring_idx, then cq_entries proto_cqe */
	uint64_t staging_off;    /* page aligned */
	uint64_t size;           /* whole memfd */
};

enum proto_op {
	PROTO_OP_OFFER  = 1,
	PROTO_OP_UPLOAD = 2,
	PROTO_OP_DROP   = 3,
	PROTO_OP_FORGET = 4,
	PROTO_OP_ZERO   = 5,
};

#define PROTO_SQE_FILE_READ 0x1u /* the page was just filled by a file read */

/* struct proto_sqe - submission entry, client to pool; untrusted */
struct proto_sqe {
	uint64_t page;       /* guest page index, < guest_pages */
	uint64_t hash[2];    /* XXH3-128 of the page: low64, high64 */
	uint16_t op;         /* enum proto_op */
	uint16_t flags;      /* PROTO_SQE_* */
	uint32_t staging;    /* UPLOAD: staging slot index; else unused */
	uint32_t seg;        /* DROP: segment id; else unused */
	uint32_t slot;       /* DROP: page index inside the segment; else unused */
};

enum proto_verdict {
	PROTO_V_MAP      = 1, /* map seg/slot at page; the pool holds a reference for you */
	PROTO_V_UPLOAD   = 2, /* copy this page into a staging slot and send UPLOAD */
	PROTO_V_DONE     = 3, /* UPLOAD accepted but nobody needs it any more; staging free */
	PROTO_V_MISMATCH = 4, /* uploaded bytes do not hash to the claimed hash */
	PROTO_V_NOSPACE  = 5, /* store full; keep the page private */
	PROTO_V_EINVAL   = 6, /* malformed entry (bad op, index, slot, staging) */
	PROTO_V_UNSHARED = 7, /* domain sharing is off; keep the page private */
};

/* struct proto_cqe - completion entry, pool to client */
struct proto_cqe {
	uint64_t page;       /* guest page index the verdict is about */
	uint32_t verdict;    /* enum proto_verdict */
	uint32_t seg;        /* MAP: segment id */
	uint32_t slot;       /* MAP: page index inside the segment */
	uint32_t staging;    /* staging slot that is free again, or PROTO_NO_STAGING */
	uint32_t op;         /* the op this answers (enum proto_op), 0 if unsolicited */
	uint32_t reserved;
};

static_assert(sizeof(struct proto_hdr) == 16, "proto_hdr layout");
static_assert(sizeof(struct proto_hello) == 16 + 32 + 32 + 8, "proto_hello layout");
static_assert(sizeof(struct proto_hello_reply) == 16 + 24 + 64, "proto_hello_reply layout");
static_assert(sizeof(struct proto_seg_req) == 24, "proto_seg_req layout");
static_assert(sizeof(struct proto_seg_reply) == 32, "proto_seg_reply layout");
static_assert(sizeof(struct proto_ring_idx) == 128, "proto_ring_idx layout");
static_assert(offsetof(struct proto_ring_idx, tail) == 64, "head and tail on separate lines");
static_assert(sizeof(struct proto_ring_hdr) == 56, "proto_ring_hdr layout");
static_assert(sizeof(struct proto_sqe) == 40, "proto_sqe layout");
static_assert(sizeof(struct proto_cqe) == 32, "proto_cqe layout");

/* Layout of the ring memfd for a given shape; both sides compute it the same way. */
static inline uint64_t proto_ring_sq_off(void) { return 4096; }
static inline uint64_t proto_ring_cq_off(uint32_t sq_entries)
{
	uint64_t end = proto_ring_sq_off() + sizeof(struct proto_ring_idx) +
		       (uint64_t)sq_entries * sizeof(struct proto_sqe);
	return (end + 4095) & ~4095ull;
}
static inline uint64_t proto_ring_staging_off(uint32_t sq_entries, uint32_t cq_entries)
{
	uint64_t end = proto_ring_cq_off(sq_entries) + sizeof(struct proto_ring_idx) +
		       (uint64_t)cq_entries * sizeof(struct proto_cqe);
	return (end + 4095) & ~4095ull;
}
static inline uint64_t proto_ring_size(uint32_t sq, uint32_t cq, uint32_t staging)
{
	return proto_ring_staging_off(sq, cq) + (uint64_t)staging * PROTO_PAGE_SIZE;
}

/* Shared-memory ring indices: acquire on the other side's index, release on ours. */
static inline uint32_t proto_load_acquire(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void proto_store_release(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

#endif
