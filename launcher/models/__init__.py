"""``launcher models``: fetch, list, verify and locate the checkpoints a recipe serves.

``sources`` turns a recipe into what to fetch (repo, revision, folder);
``hub`` talks to the Hugging Face Hub (or its cache, offline) through
``huggingface_hub``; ``folders`` owns the state of ``$MODELS_DIR/<name>``
(the marker a pull leaves, completeness, the Gemma 4 config repair);
``cli`` is the typer sub-app.
"""
