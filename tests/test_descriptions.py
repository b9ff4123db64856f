"""The fast descriptions of many GPTDatasets and their blend are, byte for byte,
json.dumps(indent=4) of Megatron's unique identifiers."""

import json
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from mmfs.megatron.build.builder import _Descriptions
from mmfs.megatron.indices.blend import blend_description
from mmfs.megatron.indices.gpt import GptParams

paths = st.text(min_size=1, max_size=30)
samples = st.one_of(st.none(), st.integers(0, 2**40))
splits = st.sampled_from(["train", "valid", "test"])
tokenizers = st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.text(max_size=8),
                                                            st.integers()), max_size=4)


@settings(max_examples=60, deadline=None)
@given(datasets=st.lists(st.tuples(paths, samples), min_size=0, max_size=5), split=splits,
       tokenizer=tokenizers, config_split=st.one_of(st.none(), st.just("969,30,1")),
       weights=st.lists(st.floats(0.001, 10), min_size=1, max_size=5),
       size=st.one_of(st.none(), st.integers(0, 10**9)))
def test_fast_descriptions_are_megatrons(datasets, split, tokenizer, config_split, weights, size):
    fast = _Descriptions()
    matrix = None if config_split is None else [[0, 0.969], [0.969, 0.999], [0.999, 1.0]]
    texts = []
    for path, n in datasets:
        p = GptParams(path, split, 0, 10, n, 4096, 1234, True, True, config_split, matrix,
                      tokenizer)
        texts.append(fast.gpt(p))
        assert texts[-1] == p.description()
    identifiers = [json.loads(t, object_pairs_hook=OrderedDict) for t in texts]
    assert fast.blend(texts, split, weights, size) == blend_description(identifiers, split,
                                                                        weights, size)
