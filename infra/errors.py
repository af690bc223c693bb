"""Errors for a bad set-up. Each message says what is wrong and how to fix it."""

from __future__ import annotations


class SetupError(RuntimeError):
    """The machine or the configuration cannot run the stack; the message says what to fix."""


class JavaError(SetupError):
    """Java is missing or too old."""


class PortInUseError(SetupError):
    """A port the stack needs is taken by another process."""


class JarResolutionError(SetupError):
    """Maven artifacts could not be resolved."""


class BrokerStartError(SetupError):
    """The Kafka broker did not come up."""


class ConfigError(SetupError):
    """A setting has a value that cannot work."""


class KafkaAccessError(ConfigError):
    """Kafka refused the client: wrong credentials, or a TLS certificate it cannot verify."""
