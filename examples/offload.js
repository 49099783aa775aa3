// Offloading saved activations from gjs: contexts nest, per thread.
//
//   gjs -m examples/offload.js
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import Gmlp from 'gi://Gmlp?version=1.0';
import System from 'system';

const dev = Gmlp.Device.get_default();
const ctx = Gmlp.OffloadContext.new(dev);
const layers = [0, 1, 2].map(i => {
    const layer = Gmlp.GroupedLinear.new(dev, 4, 64, 64);
    layer.init_parameters(i);
    return layer;
});
let act = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 4, 32, 64);
act.fill_random(1, 1.0);

// enabled { layer0; disabled { layer1 }; layer2 }
const saved = [];
ctx.push_thread_default(true);
for (const [i, layer] of layers.entries()) {
    if (i === 1)
        ctx.push_thread_default(false);
    const [y, s] = layer.forward(act);
    saved.push(s);
    act = y;
    if (i === 1)
        ctx.pop_thread_default();
}
ctx.pop_thread_default();
print(`offloaded: ${saved.map(s => s.offload)}; ${ctx.bytes_on_host} bytes on the host`);

for (let i = layers.length - 1; i >= 0; i--)
    act = layers[i].backward(saved[i], act);
print(`after backward: ${ctx.bytes_on_host} bytes on the host, ${ctx.prefetches} prefetches`);
System.exit(saved.map(s => s.offload).join() === 'true,false,true' ? 0 : 1);
