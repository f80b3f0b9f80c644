"""The engines that measure acceptance (layer 3, below the stages): the registry and interface (``registry.py``),
the options every engine takes (``options.py``: ValidateOptions), the counters and their standard errors
(``metrics.py``), the in-process engines (``in_process.py``: vllm, reference, auto; ``vllm_engine.py`` with its
worker ``vllm_worker.py`` and ``attention_backend.py``; ``reference.py``) and the server engine (``server.py`` with
``server_client.py``, ``server_speed.py``, ``server_tokenizer.py``, ``server_models.py``).

The validate stage (``validate/``), quantize's gate, calibration and ``watch`` measure through these modules; no
engine imports a stage. This ``__init__`` imports nothing: ``python -m eagle_migrate.engines.vllm_worker`` runs in a
vLLM-only Python, and the built-in in-process engines register when ``in_process`` is imported.
"""
