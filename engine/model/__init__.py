"""Model families, described once (families, torch-free), whether a folder is a model Parley can
load (folder_check, torch-free), loading it (load), weight formats (weights) and their int8
kernels, and the one lock under which torch and transformers are imported (heavy_imports,
torch-free). load imports weights, never the other way round.
May import: device, protocol, pictures, platform."""
