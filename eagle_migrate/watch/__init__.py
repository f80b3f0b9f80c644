"""``watch``: a live deployment's acceptance, window after window (``loop.py``: the loop, restarts, alerts), its
typed options and results (``models.py``), the statistics (``stats.py``), the reference it is compared with
(``reference.py``) and the per-request histogram from the deployment's responses (``responses.py``). It reads the
server through the server engine's client (``engines/server_client.py``); it imports no other stage.
"""
