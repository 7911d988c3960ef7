"""What master, agent and harness all speak: wire models, model-definition packing, process helpers."""
