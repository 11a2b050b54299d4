"""`--speculative-config`: vLLM's JSON read and checked at startup, naming what is wrong."""

from __future__ import annotations

import pytest

from kvledger.config.scheduler import EngineConfig
from kvledger.config.speculative import parse_speculative_config
from scheduler_svc.core.speculative import SpecConfig


def test_off_by_default_and_vllm_shapes_read():
    assert parse_speculative_config("") is None
    fields = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4}')
    assert SpecConfig(**fields) == SpecConfig(num_speculative_tokens=4)
    suffix = parse_speculative_config(
        '{"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_spec_factor": 2}'
    )
    assert SpecConfig(**suffix).max_spec_factor == 2.0
    only_max = parse_speculative_config('{"num_speculative_tokens": 2, "prompt_lookup_max": 2}')
    assert (only_max["prompt_lookup_min"], only_max["prompt_lookup_max"]) == (2, 2)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method must be one of"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"num_speculative_tokens": 0}', "positive integer"),
        ('{"num_speculative_tokens": true}', "positive integer"),
        ('{"num_speculative_tokens": 99}', "at most"),
        ('{"num_speculative_tokens": 2, "model": "x"}', "unknown keys ['model']"),
        (
            '{"num_speculative_tokens": 2, "prompt_lookup_min": 6, "prompt_lookup_max": 4}',
            "exceeds",
        ),
        ('{"num_speculative_tokens": 2, "suffix_decoding_max_spec_factor": -1}', "positive number"),
    ],
)
def test_a_bad_value_stops_startup_naming_it(text, says):
    with pytest.raises(ValueError, match="speculative_config") as err:
        EngineConfig(speculative_config=text)
    assert says in str(err.value)
