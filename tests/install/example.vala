// A Vala program against an installed libgmlp (tests/install/test-install.sh).
int main () {
    try {
        var dev = new Gmlp.Device (Gmlp.DeviceKind.CPU, 0);
        var x = new Gmlp.GroupedTensor.uniform (dev, Gmlp.DType.FLOAT32, 2, 3, 16);
        x.fill_random (1, 1.0);
        var layer = new Gmlp.GroupedLinear (dev, 2, 16, 8);
        Gmlp.SavedActivations saved;
        var y = layer.forward (x, out saved);
        print ("vala: y has %lld rows of %lld\n", y.get_total_rows (), y.get_cols ());
        return y.get_total_rows () == 6 && y.get_cols () == 8 ? 0 : 1;
    } catch (Error e) {
        printerr ("vala: %s\n", e.message);
        return 1;
    }
}
