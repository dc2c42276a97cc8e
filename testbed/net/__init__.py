"""The emulated network: topology (pure data), backends that build it, shapers that shape it."""
