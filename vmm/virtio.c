/* virtio.c: the virtio-mmio transport (version 2) and split virtqueues over guest RAM. */
