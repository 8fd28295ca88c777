"""What both engines and every caller share: Turn, Message and the events (events), TurnStats,
EngineSettings, the declared engine protocol `EngineLike` (engine_like), the `EngineWorker`
thread, typed requests, listeners and turn bookkeeping both engines build on (worker), and
blocking helpers over the events (client). Torch-free.
May import: pictures, platform."""
