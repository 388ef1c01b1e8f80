"""Hydra override strings, as a command line and a sweep's records hold them. Imports no other psgd module."""

import re
import shlex


def override_key(text: str) -> str:
    """The key an override sets (`+data.seed=1` -> data.seed; a flag is its own key)."""
    return text.split("=", 1)[0].lstrip("+~")


def as_typed(override: str) -> str:
    """An override without the escapes Hydra's sweeper adds to a job's string values
    (`trainer.max_time=00\\:00\\:01\\:00` -> `trainer.max_time=00:00:01:00`)."""
    key, sep, value = override.partition("=")
    return key + sep + re.sub(r"\\([\\()\[\]{}:=, \t])", r"\1", value)


def shell_override(key: str, value: object) -> str:
    """`key=value` as one shell word that Hydra reads back as the string `value` (a path with a space,
    a non-ASCII letter or a # is quoted for both)."""
    text = str(value)
    if re.fullmatch(r"[\w/.+:@%-]+", text, re.ASCII) and not text.startswith("~"):
        return f"{key}={text}"
    if not any(c in text for c in "'\"$`\\!"):  # no character either quoting would take as its own
        return f"\"{key}='{text}'\""
    # Hydra's escapes in a quoted value: \' for a quote, \\ for a backslash before a quote or at the end
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text).replace("'", "\\'")
    return shlex.quote(f"{key}='{escaped}'")
