"""The agent's configuration error: one line naming the key path and the bad value (agent.config and agent.trust
raise it; a caller catches it from either)."""


class ConfigError(ValueError):
    """The configuration cannot be used; the message is one line naming the key path and the bad value."""
