"""The worker process: model, executors (ir and torch), transport, filler and tracing."""
