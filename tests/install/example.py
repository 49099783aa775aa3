# A Python program against an installed libgmlp (tests/install/test-install.sh):
# checks that the typelib and the library come from PREFIX and the overrides
# from OVERRIDES-DIR (example.py PREFIX OVERRIDES-DIR).
import os
import sys

import gi
gi.require_version('Gmlp', '1.0')
gi.require_version('GIRepository', '2.0')
from gi.repository import GIRepository, Gmlp  # noqa: E402
import gi.overrides.Gmlp  # noqa: E402

prefix, overrides_dir = (os.path.realpath(path) for path in sys.argv[1:3])
dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
x = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 2, 3, 16)
x.fill_random(1, 1.0)
layer = Gmlp.GroupedLinear.new(dev, 2, 16, 8)
y, saved = layer.forward(x)
assert y.get_total_rows() == 6 and y.get_cols() == 8
assert len(y) == 2                                   # an override
overrides = os.path.realpath(gi.overrides.Gmlp.__file__)
libraries = {line.split()[-1] for line in open('/proc/self/maps') if 'libgmlp' in line}
typelib = GIRepository.Repository.get_default().get_typelib_path('Gmlp')
for path, where in [(overrides, overrides_dir), (typelib, prefix)] + [(p, prefix) for p in sorted(libraries)]:
    if not os.path.realpath(path).startswith(where + os.sep):
        sys.exit('python: %s is not under %s' % (path, where))
print('python:', overrides, typelib, ' '.join(sorted(libraries)))
