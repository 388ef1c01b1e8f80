"""Imported by psgd's fork server only, last of its preloads (psgd.forkserver.PRELOAD).

The server exits once its launcher has, and until it has exited it holds the launcher's stdout and stderr
(which it passes on to the workers): whoever reads them (`| tee`, a test's capture) would wait for the
server's interpreter shutdown too, a full garbage collection and module teardown with torch and Lightning
loaded. The server has nothing to flush or close by then: it ends at once. Its workers never run this (a
fork server's child leaves by os._exit without running exit handlers)."""

import atexit
import os

atexit.register(os._exit, 0)  # registered last, so run first of the exit handlers
