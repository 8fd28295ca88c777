"""Model families, described once (families, torch-free), whether a folder is a model Parley can
load (folder_check, torch-free), loading it (load), weight formats (weights) and their CPU
kernels (int8_layers, packed_linear, kv_growth; numba's one-row kernels: row_kernels, numba_rows,
shared_input), this machine's measured format speeds (calibrate; the record, torch-free: speed),
and the one lock under which torch and transformers are imported (heavy_imports, torch-free).
load imports weights, never the other way round.
May import: device, protocol, pictures, platform."""
