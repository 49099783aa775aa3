/* Vala binding test: a grouped tensor built from bytes and read back,
 * compiled against gmlp-1.0.vapi.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

int main (string[] args) {
    try {
        var dev = new Gmlp.Device (Gmlp.DeviceKind.CPU, 0);
        int64[] rows = { 2, 0, 3 };
        int64 cols = 5;
        var values = new float[25];
        for (int i = 0; i < values.length; i++)
            values[i] = (float) GLib.Random.double_range (-1.0, 1.0);
        unowned uint8[] raw = (uint8[]) values;
        raw.length = values.length * 4;
        var t = new Gmlp.GroupedTensor.from_bytes (dev, Gmlp.DType.FLOAT32, rows, cols,
                                               new GLib.Bytes (raw));
        var out_bytes = t.to_bytes ();
        if (out_bytes.compare (new GLib.Bytes (raw)) != 0) {
            print ("1..1\nnot ok 1 /Gmlp/Vala/round-trip # data differs\n");
            return 1;
        }
        var layer = new Gmlp.GroupedLinear (dev, 3, 5, 7);
        int ready = 0;
        layer.wgrad_ready.connect ((event) => { ready++; });
        Gmlp.SavedActivations saved;
        var y = layer.forward (t, out saved);
        var dx = layer.backward (saved, y);
        if (ready != 1 || dx.get_cols () != 5 || y.get_cols () != 7) {
            print ("1..1\nnot ok 1 /Gmlp/Vala/round-trip # grouped linear\n");
            return 1;
        }
        var half = t.convert (Gmlp.DType.FLOAT16);
        if (half.get_total_rows () != 5 || half.get_n_groups () != 3) {
            print ("1..1\nnot ok 1 /Gmlp/Vala/round-trip # bad shape\n");
            return 1;
        }
    } catch (GLib.Error e) {
        print ("1..1\nnot ok 1 /Gmlp/Vala/round-trip # %s\n", e.message);
        return 1;
    }
    print ("1..1\nok 1 /Gmlp/Vala/round-trip\n");
    return 0;
}
