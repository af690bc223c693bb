"""The ``iotfraud`` command: one entry point over every component."""
