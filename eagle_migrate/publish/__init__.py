"""``publish``: build a Hub repository folder for a drafter and upload it in one commit through huggingface_hub.

The folder holds the checkpoint's ``config.json`` and safetensors weights (copied byte for byte), ``README.md``
(model card: ``card.py``), ``speculative_config.json`` (the dict ``vllm serve --speculative-config`` takes),
``provenance.json`` (the checkpoint's own provenance plus a ``publish`` record with the weights' sha256), and under
``validation/`` the validation report (``report.json``, ``report.md``, plots).

* A checkpoint is published only with a passing validation report (``report.json``: an explicit ``passed: true``
  or gates that all passed) unless ``force``; a report that names other weights (``drafter_sha256`` /
  ``checkpoint_sha256`` / ``weights_sha256`` differing from ``formats.io.sha256_files`` of the weights) is refused.
* ``dry_run`` writes the folder and returns the plan: no network at all.
* Upload: ``create_repo(exist_ok=True, private=...)``, ``create_branch(revision, exist_ok=True)`` when a revision is
  given, then ONE ``create_commit`` (PR when ``create_pr``; against ``revision`` when given). The token comes from
  the ``token`` argument or huggingface_hub's own resolution (``HF_TOKEN``, then the stored login); it is never
  printed, logged, written, or left in an exception message (every error text is scrubbed).
* The input checkpoint is only read.

Modules, by job: ``models`` (the result, file names), ``report`` (the validation report as read: verdict, gate rows,
suite table), ``provenance`` (provenance.json, target and license, what may leave the machine), ``serving`` (the
speculative config and serving commands), ``card`` (the model card), ``folder`` (the repo folder), ``upload`` (the
Hub commit), ``options`` (PublishOptions), ``stage`` (``publish()``).
"""

from __future__ import annotations

from .models import REPO_ID, PlannedFile, PublishResult, ValidationStatus
from .options import PublishOptions
from .provenance import public, scrub
from .report import LoadedReport, load_report
from .stage import publish

__all__ = ["REPO_ID", "LoadedReport", "PlannedFile", "PublishOptions", "PublishResult", "ValidationStatus", "load_report",
           "public", "publish", "scrub"]
