"""The emulated network: backends that build a topology, shapers that shape it, measurements."""
