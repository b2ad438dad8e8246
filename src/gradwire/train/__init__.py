"""Data-parallel training: the worker each rank runs and the aggregation it uses."""
