"""Running a model: what the executor asks of one (`base.Runner`, `base.load_runner`), the
decoder on paged KV memory (`model_runner`, `kv_cache`, `cuda_graphs`), the encoder
(`embedding_runner`), a step's chunks as one token batch (`batch`), and embedding pooling
(`pooling`)."""
