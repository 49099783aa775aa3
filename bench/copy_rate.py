#!/usr/bin/env python3
# Device-to-device copy rate (read + write), as the anchors' README counts it.
import json, sys, torch
n = int(sys.argv[1]) if len(sys.argv) > 1 else 512 << 20
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(10): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(50):
    s.record(); b.copy_(a); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); ms = ts[len(ts) // 2]
print(json.dumps({"bench": "d2d-copy", "device": torch.cuda.get_device_name(), "bytes": n, "ms": ms, "gbps": 2 * n / (ms * 1e-3) / 1e9}))
