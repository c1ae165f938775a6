"""A bundle's `code/`: the inference.py contract, importing it, its requirements.txt and lib/,
and reloading it when it changes."""
