"""nccl-tests-style benchmarks of the registry's algorithms beside torch.distributed's own."""
