"""From a step's logits to its tokens: each request's sampling settings (`sampling_params`),
the penalties and logit bias (`penalties`), the grammar masks of structured outputs
(`constraints`), and the sampler that applies them and draws (`sampler`)."""
