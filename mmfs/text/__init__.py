"""Text to tokens: Megatron's tokenizer types, JSONL and Parquet input read in bounded
memory, and the pipeline that writes IndexedDatasets as Megatron's
tools/preprocess_data.py does. `mmfs preprocess` and text datasets in a config
(tokenized into the cache on first use) run the same code."""
