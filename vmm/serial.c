/* serial.c: a 16550 UART on port 0x3f8 wired to the terminal. */
