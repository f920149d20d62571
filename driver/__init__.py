"""vtakit.driver: the JIT runtime driver that builds instruction streams and runs them on a device."""
