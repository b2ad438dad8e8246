"""Trace-driven network simulation of data-parallel training (the network-operator paper).

trace (what compute looks like) → engine (events, max-min fair flows) → replay (library
schedules on the network) → ps / collective (mechanisms) → mechanisms (names, options) →
report (tables, sweeps, timeline). See docs/simulator.md.
"""
