// A gjs module against an installed libgmlp (tests/install/test-install.sh).
import Gmlp from 'gi://Gmlp?version=1.0';
import System from 'system';

const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
const x = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 2, 3, 16);
x.fill_random(1, 1.0);
const layer = Gmlp.GroupedLinear.new(dev, 2, 16, 8);
const [y] = layer.forward(x);
print(`gjs: y has ${y.get_total_rows()} rows of ${y.get_cols()}`);
System.exit(y.get_total_rows() === 6 && y.get_cols() === 8 ? 0 : 1);
