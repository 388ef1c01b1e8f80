"""Imported by psgd's fork server only, last of its preloads (psgd.forkserver.PRELOAD): the server, which
holds the launcher's stdout and stderr until it exits, ends at once without an interpreter shutdown, so
that whoever reads them (`| tee`) is not kept waiting. Its workers never run this (they leave by os._exit)."""

import atexit
import os

atexit.register(os._exit, 0)  # registered last, so run first of the exit handlers
