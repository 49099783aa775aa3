/* Vala binding test: a Gmlp.MoELayer made from properties, one forward and
 * backward, the shapes and the routing's counts checked, compiled against
 * gmlp-1.0.vapi.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

const int64 T = 29;
const int64 H = 16;
const int64 F = 24;
const uint E = 4;
const uint K = 2;

int fail (string why) {
    print ("1..1\nnot ok 1 /Gmlp/Vala/moe-layer # %s\n", why);
    return 1;
}

int main (string[] args) {
    try {
        var dev = new Gmlp.Device (Gmlp.DeviceKind.CPU, 0);
        var layer = (Gmlp.MoELayer) Object.new (typeof (Gmlp.MoELayer),
                                                "device", dev, "hidden", H, "ffn-hidden", F,
                                                "n-experts", E, "top-k", K,
                                                "activation", Gmlp.Activation.GEGLU,
                                                "dtype", Gmlp.DType.BFLOAT16,
                                                "flags", Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT,
                                                "capacity-factor", 1.0,
                                                "z-loss-coeff", 0.001);
        layer.init (null);
        layer.init_parameters (3);
        if (layer.get_hidden () != H || layer.get_ffn_hidden () != F || layer.get_n_experts () != E)
            return fail ("sizes");

        int64[] rows = { T };
        var x = new Gmlp.GroupedTensor (dev, Gmlp.DType.BFLOAT16, rows, H);
        x.fill_random (7, 1.0);
        Gmlp.SavedActivations? saved;
        var y = layer.forward (x, out saved);
        if (y.get_n_groups () != 1 || y.get_total_rows () != T || y.get_cols () != H ||
            y.get_dtype () != Gmlp.DType.BFLOAT16)
            return fail ("output shape");

        var routing = layer.get_routing ();
        if (routing.get_n_tokens () != T || routing.get_top_k () != K)
            return fail ("routing shape");
        var count_bytes = layer.get_tokens_per_expert ().to_bytes ();
        if (count_bytes.get_size () != E * sizeof (int64))
            return fail ("tokens per expert");
        unowned int64[] counts = (int64[]) count_bytes.get_data ();
        int64 total = 0;
        for (uint e = 0; e < E; e++)
            total += counts[e];
        if (total != T * K)
            return fail ("the counts add up to %s, not T × k".printf (total.to_string ()));

        var dx = layer.backward (saved, y);
        if (!saved.is_consumed () || dx.get_total_rows () != T || dx.get_cols () != H)
            return fail ("dx shape");
        var wgrad = layer.get_experts ().get_fc1 ().get_wgrad ();
        if (wgrad == null || wgrad.get_n_groups () != E || wgrad.get_cols () != H)
            return fail ("experts' gradient");
        if (layer.get_router ().get_wgrad () == null)
            return fail ("gate gradient");

        try {
            layer.backward (saved, y);
            return fail ("a second backward was not refused");
        } catch (Gmlp.Error e) {
            if (!(e is Gmlp.Error.INVALID_STATE))
                return fail ("a second backward: " + e.message);
        }
    } catch (GLib.Error e) {
        return fail (e.message);
    }
    print ("1..1\nok 1 /Gmlp/Vala/moe-layer\n");
    return 0;
}
