"""`mmfs preprocess`: JSONL to Megatron IndexedDatasets, byte for byte as Megatron's
tools/preprocess_data.py writes them."""
