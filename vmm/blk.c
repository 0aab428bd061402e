/* blk.c: virtio-blk backed by a host file, reads and writes through io_uring. */
