/* Offloading saved activations from Vala: contexts nest, per thread.
 *
 *   valac --pkg gmlp-1.0 examples/offload.vala
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

int main (string[] args) {
    try {
        var dev = Gmlp.Device.get_default ();
        var ctx = new Gmlp.OffloadContext (dev);
        var layers = new Gmlp.GroupedLinear[3];
        for (int i = 0; i < 3; i++) {
            layers[i] = new Gmlp.GroupedLinear (dev, 4, 64, 64);
            layers[i].init_parameters (i);
        }
        var act = new Gmlp.GroupedTensor.uniform (dev, Gmlp.DType.FLOAT32, 4, 32, 64);
        act.fill_random (1, 1.0);

        /* enabled { layer0; disabled { layer1 }; layer2 } */
        var saved = new Gmlp.SavedActivations[3];
        ctx.push_thread_default (true);
        for (int i = 0; i < 3; i++) {
            if (i == 1)
                ctx.push_thread_default (false);
            act = layers[i].forward (act, out saved[i]);
            if (i == 1)
                ctx.pop_thread_default ();
        }
        ctx.pop_thread_default ();
        print ("offloaded: %s %s %s; %llu bytes on the host\n",
               saved[0].offload.to_string (), saved[1].offload.to_string (),
               saved[2].offload.to_string (), ctx.bytes_on_host);

        for (int i = 2; i >= 0; i--)
            act = layers[i].backward (saved[i], act);
        print ("after backward: %llu bytes on the host\n", ctx.bytes_on_host);
        return saved[0].offload && !saved[1].offload && saved[2].offload ? 0 : 1;
    } catch (Error e) {
        printerr ("%s\n", e.message);
        return 1;
    }
}
