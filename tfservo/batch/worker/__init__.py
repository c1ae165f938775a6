"""What every pipeline adapter (Beam, Ray Data, Spark) shares, none of it importing an engine:
a bundle loaded in a worker with the server's model, version, signature and method selection
(`LoadedBundle`), elements stacked into signature inputs and outputs split back, and
per-element failures."""
