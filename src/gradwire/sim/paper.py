"""Traces for the network-operator paper's four models, from the built-in profiles (exact
parameter sizes from the architectures) and the compute times of the paper's Table 3, and the
paper's own numbers (Tables 4 and 6) to set the simulation beside: its order of mechanisms as
(faster, slower) pairs, and the pairs this simulator does not reproduce, with why.

Table 3 gives forward and backward compute (TensorFlow 1.4, batch 32 per worker) with the
backward time *excluding* the first layer of backpropagation. The first layer's time is given
for no model; the paper says VGG-16 spends "nearly all" its backward compute there, so VGG-16
gets Table 5's whole backward pass (260 ms, Pascal Titan X) minus Table 3's 24 ms, and the
others get none. No source gives per-layer times: each pass is spread evenly over tensors.
"""

from __future__ import annotations

from gradwire.sim.trace import Trace, profile_tensors, synthetic

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
    sizes, names, shapes = profile_tensors(profiles.load(name))
    return synthetic(model, sizes, fwd, bwd + first, first, names,
                     f"built-in profile {name} (sizes and shapes); network-operator paper "
                     f"Table 3 (compute: forward {fwd} s, backward {bwd} s + first layer "
                     f"{first} s)", shapes)


# ---------------------------------------------------------------- the paper's order

# Iteration times closer than this (relative) are a tie: the paper prints speed-ups to three
# significant digits, and its closest strict pair (6.76x against 6.75x) is 0.15 % apart.
TIE = 1e-3
# The mechanisms §8.3 sets head to head: every gap the paper reports among them is checked.
KEY = ("ring", "multicast+ina", "butterfly")


def paper_pairs(model: str, mechs: tuple[str, ...]) -> list[tuple[str, str]]:
    """The paper's order for ``model`` among ``mechs`` (``ps`` has speed-up 1) as (faster,
    slower) pairs: each mechanism against those at the next lower speed-up of Tables 4 and 6,
    then every pair of :data:`KEY` the tables separate. Equal speed-ups give no pair."""
    sp = {m: 1.0 if m == "ps" else PAPER_SPEEDUPS[model][m] for m in mechs}
    levels = sorted(set(sp.values()), reverse=True)
    pairs = [(a, b) for hi, lo in zip(levels, levels[1:], strict=False)
             for a in mechs if sp[a] == hi for b in mechs if sp[b] == lo]
    pairs += [(a, b) for a in KEY for b in KEY if a in sp and b in sp and sp[a] > sp[b]
              and (a, b) not in pairs]
    return pairs


def holds(times: dict[str, float], faster: str, slower: str) -> bool:
    """Whether ``faster``'s iteration time is shorter than ``slower``'s by more than a tie."""
    return times[faster] < times[slower] * (1 - TIE)


# Why a pair of the paper's order does not hold here, at the default host costs (α 10 µs,
# latency 1.5 µs per host; docs/simulator.md has the numbers).
_HIDDEN = ("multicast+ina hides all communication behind this compute-bound model's compute "
           "(exposed under 1 ms at every α: the pushes overlap backward, the multicast overlaps "
           "forward), so nothing can be ahead of it: a tie at α = 0, behind at α > 0; the "
           "paper's multicast+ina is 0.1-0.24 s slower than Table 3's compute (Table 8), from "
           "costs the paper does not describe")
_VGG_RING = ("VGG-16 is bandwidth-bound: multicast+ina moves the model up, then down, and "
             "overlaps the forward pass with the download; ring moves about twice the model "
             "each way at once but starts the forward pass only when its last allreduce is done "
             "(§3.2), so it is behind by about the forward pass at every α")
_VGG_MC = ("multicast saves VGG-16's distribution what ina saves its aggregation: 31 x 553 MB "
           "through the server's link either way, so they tie (within 0.1 %) at every α; the "
           "paper puts multicast 2.6 % ahead (backpropagation staggering, not quantified)")
_R101_RING = ("ring with messaging sends 62 messages per tensor to butterfly's 5: for "
              "ResNet-101's 314 tensors at 13 µs per message that is 0.25 s of send port time "
              "against a 0.18 s backward pass; the paper's order holds on the ideal network and "
              "up to half the default host costs")
_R200_RMC = ("ring+multicast exposes 75 ms on ResNet-200 (31 reduce-scatter messages per "
             "tensor, then one multicast per block, each paying α on its rank's send port), "
             "while butterfly moves 5 x 258 MB per worker against a 0.34 s backward pass and "
             "exposes 0.11 s; the paper has them 0.4 % apart")
DISAGREEMENTS: dict[tuple[str, str, str], str] = {
    ("inception-v3", "ring", "multicast+ina"): _HIDDEN,
    ("inception-v3", "butterfly", "multicast+ina"): _HIDDEN,
    ("vgg16", "ring", "multicast+ina"): _VGG_RING,
    ("vgg16", "ring+multicast", "multicast+ina"): _VGG_RING,
    ("vgg16", "multicast", "ina"): _VGG_MC,
    ("resnet101", "ring", "butterfly"): _R101_RING,
    ("resnet101", "butterfly", "multicast+ina"): _HIDDEN,
    ("resnet101", "ring", "multicast+ina"): _HIDDEN,
    ("resnet200", "butterfly", "ring+multicast"): _R200_RMC,
    ("resnet200", "ring", "multicast+ina"): _HIDDEN,
    ("resnet200", "butterfly", "multicast+ina"): _HIDDEN,
}
