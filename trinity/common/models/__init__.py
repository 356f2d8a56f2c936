"""What workflows talk to, and the types every engine shares.

- ``model``: ``ModelWrapper`` (the developer guide's ``model``: ``chat``, ``generate``, the
  OpenAI clients, history) in front of an ``InferenceModel``, the interface engines implement.
- ``sampling``: ``SamplingParams``, how one request is sampled.
- ``client`` / ``reply_tokens``: the wrapper's recording OpenAI clients, and the token data
  the engines' server adds to a reply for them.

Extending: a new engine is not added here but in ``trinity/engine/`` (or a plugin), as an
``InferenceModel`` registered in ``ENGINES``; nothing here imports the engines.
"""
