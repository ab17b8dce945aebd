"""``type = "diffusers"``: a local diffusers pipeline directory served as an SDK model.

* :mod:`.loader` — ``create(options, root)``: reads ``model_index.json``, picks the
  pipeline kind, checks the parts, builds the SDK model;
* :mod:`.options` — the model options (pure);
* :mod:`.components` — the directory's parts loaded with diffusers (local files
  only), shared by the instances of one server;
* :mod:`.kinds` — one :class:`~mortred_twisted.sdk.ServedModel` per pipeline kind,
  its inputs declared by its ``predict`` signature;
* :mod:`.prompt_batch` — text-to-image runs stepped together (one UNet call per step);
* :mod:`.pipe_call` — the unbatched kinds' runs (diffusers' calls, or our plain loop);
* :mod:`.sampling` — what the kinds share: plans, pictures, previews, the result;
* the SDK adapter (``sdk/step_batching.py``) hands a kind's step batch to the server.

docs/models/diffusion.md ("type = \"diffusers\"") is the user's side.
"""
