"""TF Serving's API: REST JSON codec, tf.Example building, classify/regress results, model manager."""
