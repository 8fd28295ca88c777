"""The built-in engine: the model-owner thread (engine), one turn from pictures to stats
(pipeline, runner), sessions and their prompts, sampling, detokenizing, prompt-lookup decoding,
the memory manager and the spill scheduler.
May import: vision, kvstore, model, device, protocol, pictures, platform."""
