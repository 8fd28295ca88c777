"""Where decoded rows end and a prompt chunk begins: the one threshold the int8 layers and
row_kernels' compiled kernels share (a leaf, so neither imports the other for it)."""

# Rows from which a product goes through a GEMM (int8, else dequantized) instead of the fused one-row kernel:
# that kernel runs rows one after another (2 tok/s at 32 rows with fp32 activations on a 2-core
# EPYC, ~86 with bf16), the GEMM at the full-precision prompt speed. Above the longest decode
# step (a token plus a draft of at most 10, engine/local/lookup_decode.py), so decoding stays
# on one kernel whose rows do not depend on each other.
PROMPT_ROWS = 16
