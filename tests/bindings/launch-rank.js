// gmlp-launch from gjs (the test gjs-launch): run with the launcher's path
// and gjs's, this script starts `gmlp-launch -n 2 --devices cpu --tag gjs -m
// launch-rank.js` and checks that it exits with 0 and that both ranks said
// ok (so that the test is gjs's, and the sanitizers' runs treat it as one);
// run by the launcher (GMLP_RANK is set), it is a rank: it joins with
// Gmlp.Communicator.new_from_launcher() and all-reduces rank + 1 over the
// group, and exits non-zero unless every value is the sum.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import Gio from 'gi://Gio';
import GLib from 'gi://GLib';
import Gmlp from 'gi://Gmlp?version=1.0';
import System from 'system';

function rankMain() {
    const comm = Gmlp.Communicator.new_from_launcher();
    const rank = comm.get_rank(), world = comm.get_world_size();
    const x = Gmlp.GroupedTensor.new_from_floats(comm.get_device(), Gmlp.DType.FLOAT32, [2], 3,
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
}

function driverMain([launcher, gjs]) {
    const self = GLib.filename_from_uri(import.meta.url)[0];
    const proc = Gio.Subprocess.new([launcher, '-n', '2', '--devices', 'cpu', '--tag',
        '--timeout-ms', '60000', gjs, '-m', self], Gio.SubprocessFlags.STDOUT_PIPE);
    const [, out] = proc.communicate_utf8(null, null);
    print(out);
    if (!proc.get_successful())
        throw new Error(`gmlp-launch failed (wait status ${proc.get_status()})`);
    for (const r of [0, 1]) {
        if (!out.includes(`[${r}] rank ${r} of 2: ok`))
            throw new Error(`rank ${r} did not say ok`);
    }
}

if (GLib.getenv('GMLP_RANK') !== null)
    rankMain();
else
    driverMain(ARGV);
