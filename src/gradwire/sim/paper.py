"""Traces for the network-operator paper's four models, from the built-in profiles (exact
parameter sizes from the architectures) and the compute times of the paper's Table 3, and the
paper's own numbers (Tables 4 and 6) to set the simulation beside.

Table 3 gives forward and backward compute (TensorFlow 1.4, batch 32 per worker) with the
backward time *excluding* the first layer of backpropagation. The first layer's time is given
for no model; the paper says VGG-16 spends "nearly all" its backward compute there, so VGG-16
gets Table 5's whole backward pass (260 ms, Pascal Titan X) minus Table 3's 24 ms, and the
others get none. No source gives per-layer times: each pass is spread evenly over tensors.
"""

from __future__ import annotations

from gradwire.sim.trace import Trace, synthetic

# model: (profile, forward s, backward s without the first layer, first layer s)
TABLE3 = {
    "inception-v3": ("inception-v3", 0.176, 0.296, 0.0),
    "vgg16": ("vgg16", 0.169, 0.024, 0.236),
    "resnet101": ("resnet101", 0.176, 0.180, 0.0),
    "resnet200": ("resnet200", 0.357, 0.34, 0.0),
}

# Speed-ups over the baseline PS at 32 workers, 25 Gbps (the paper's Tables 4 and 6).
PAPER_SPEEDUPS = {
    "inception-v3": {"ina": 1.34, "multicast": 1.69, "multicast+ina": 3.28, "ring": 3.35,
                     "ring+multicast": 3.41, "butterfly": 3.41},
    "vgg16": {"ina": 1.89, "multicast": 1.94, "multicast+ina": 22.0, "ring": 24.6,
              "ring+multicast": 24.6, "butterfly": 11.3},
    "resnet101": {"ina": 1.65, "multicast": 1.79, "multicast+ina": 6.07, "ring": 6.55,
                  "ring+multicast": 6.71, "butterfly": 6.46},
    "resnet200": {"ina": 1.65, "multicast": 1.85, "multicast+ina": 6.7, "ring": 6.75,
                  "ring+multicast": 6.76, "butterfly": 6.79},
}


def paper_trace(model: str) -> Trace:
    """The trace of ``model`` (a key of TABLE3) in forward order, compute from Table 3."""
    from gradwire import profiles

    name, fwd, bwd, first = TABLE3[model]
    prof = profiles.load(name)
    params = list(reversed(prof.params))  # profiles list backward order
    return synthetic(model, [n * prof.itemsize for _, n in params], fwd, bwd + first, first,
                     [nm for nm, _ in params],
                     f"built-in profile {name} (sizes); network-operator paper Table 3 "
                     f"(compute: forward {fwd} s, backward {bwd} s + first layer {first} s)")
