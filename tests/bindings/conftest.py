# pytest configuration of the Python binding tests (tests/bindings/test_*.py):
# the uninstalled overrides ahead of any installed ones, and one random seed
# per run, printed in the header; GMLP_TEST_SEED=N repeats a run.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import random

import gi
import gi.overrides

overrides_dir = os.environ.get('GMLP_OVERRIDES_DIR')
if overrides_dir:
    gi.overrides.__path__.insert(0, overrides_dir)
gi.require_version('Gmlp', '1.0')

# Set before the test modules are imported: they seed from it.
os.environ.setdefault('GMLP_TEST_SEED', str(random.randrange(1 << 30)))


def pytest_report_header(config):
    return 'GMLP_TEST_SEED=%s' % os.environ['GMLP_TEST_SEED']
