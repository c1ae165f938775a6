"""Codecs: bytes of a media type or protocol <-> arrays. TF Serving JSON, CSV, JSON lines,
TensorProto, V2 tensors, tf.Example; `content_types` holds the media-type registry."""
