"""What both engines and every caller share: Turn, Message and the events (events), TurnStats,
EngineSettings, the `EngineWorker` thread/queue/listeners both engines build on, and blocking
helpers over the events (client). Torch-free.
May import: pictures, platform."""
