"""Where a model runs and what memory it takes: device and dtype choice (choice), the memory
ledger behind the Memory dock (ledger), process memory growth, returning freed heap to the OS.
May import: protocol, pictures, platform."""
