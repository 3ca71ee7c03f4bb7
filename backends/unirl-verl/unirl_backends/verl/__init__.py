"""The verl backend: verl's training engine (FSDP2 TrainingWorker) and core_algos in engine
mode; verl's own ``main_ppo`` trainer on GPU machines. See docs/backends/verl.md."""
