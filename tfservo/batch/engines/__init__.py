"""Transform engines: the local one (threads) and the distributed ones (Beam, Ray, Spark), all
moving the same steps (`distributed`) between workers."""
