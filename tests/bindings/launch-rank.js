// One rank of a group started by gmlp-launch (the test gjs-launch runs
// `gmlp-launch -n 2 --devices cpu gjs -m launch-rank.js`): joins with
// Gmlp.Communicator.new_from_launcher() and all-reduces rank + 1 over the
// group; exits non-zero (an exception) unless every value is the sum.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import Gmlp from 'gi://Gmlp?version=1.0';
import System from 'system';

const comm = Gmlp.Communicator.new_from_launcher();
const rank = comm.get_rank(), world = comm.get_world_size();
const dev = comm.get_device();
const x = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, [2], 3,
    new Array(6).fill(rank + 1));
comm.all_reduce(x, Gmlp.ReduceOp.SUM);
const want = world * (world + 1) / 2;
for (const v of x.to_floats()) {
    if (v !== want) {
        print(`rank ${rank}: FAILED ${v} != ${want}`);
        System.exit(1);
    }
}
print(`rank ${rank} of ${world}: ok`);
