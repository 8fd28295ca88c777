"""Model families, loading a folder (load), weight formats (weights) and their int8 kernels, and
the one lock under which torch and transformers are imported (heavy_imports, torch-free).
May import: device, protocol, pictures, platform."""
