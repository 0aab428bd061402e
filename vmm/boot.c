/* boot.c: the Linux x86 boot protocol: bzImage, boot_params, e820, initrd, long-mode entry. */
