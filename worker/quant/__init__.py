"""Linear layers whose weights stay in a GGUF file's quantized blocks (Q8_0, Q4_0, Q4_1).

`formats` names the block layouts, `kernels` builds and loads the compiled CPU operators
(`worker/csrc/quant/`), `layers` holds `QuantizedLinear` and `QuantizedEmbedding`.
"""
