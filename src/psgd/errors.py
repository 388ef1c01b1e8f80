"""The errors psgd reports to a user as one line: a leaf, importing nothing of psgd."""


class ConfigError(ValueError):
    """A bad configuration value; str() is the one-line message shown to the user."""


class DirInUse(ConfigError):
    """The run dir holds an earlier run's results: nothing may be written there, not even a failure."""
