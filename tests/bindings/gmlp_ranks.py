# A group of ranks as Python threads, for the binding tests of
# Gmlp.Communicator and of what runs on it: rank r in a thread of its own
# with a CPU device of its own (cpu:r). Imported by the test files (pytest
# puts their folder on sys.path).
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import threading

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import Gmlp  # noqa: E402


def run_group(world, body, timeout_ms=60000):
    """Runs body(comm, rank) on world threads; returns their results, and
    raises the first exception any of them raised."""
    devices = [Gmlp.Device.new_from_string('cpu:%d' % r) for r in range(world)]
    uid = Gmlp.Communicator.new_unique_id(devices[0])
    results, errors = [None] * world, [None] * world

    def rank(r):
        try:
            comm = Gmlp.Communicator(device=devices[r], unique_id=uid, rank=r, world_size=world,
                                     timeout_ms=timeout_ms)
            comm.init(None)
            results[r] = body(comm, r)
        except BaseException as e:  # noqa: B902 - handed to the main thread
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results
