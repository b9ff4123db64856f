"""Commands built on the layers below: build/sample, which, bench, demo, preprocess."""
