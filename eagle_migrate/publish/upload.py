"""The upload through huggingface_hub: the token (the argument, else huggingface_hub's own resolution), the repo and
branch, ONE ``create_commit`` (a PR when asked), and every Hub error as one scrubbed line (no token, no credentials).

Imports: huggingface_hub (lazily), ``errors``, ``publish.models``, ``publish.provenance`` (scrub).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import EagleMigrateError, HubError, InputError
from .models import PlannedFile
from .provenance import scrub


def _resolve_token(token: str | None) -> str:
    if token:
        return token
    import huggingface_hub  # lazy: huggingface_hub (0.2 s), only when uploading

    try:
        got = huggingface_hub.get_token()
    except Exception as e:  # e.g. an OIDC exchange that failed: say why, without any secret
        raise InputError(f"could not get a Hugging Face token: {scrub(str(e).splitlines()[0] if str(e) else e.__class__.__name__, None)}",
                         "set HF_TOKEN (a write token) or run `hf auth login`") from None
    if not got:
        raise InputError("no Hugging Face token: HF_TOKEN is not set and there is no stored login",
                         "set HF_TOKEN to a token with write access, or run `hf auth login`; --dry-run needs none")
    return got


def _hub_error(e: Exception, token: str, what: str) -> EagleMigrateError:
    from huggingface_hub.errors import (  # lazy: huggingface_hub (0.2 s), only when uploading
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    first = str(e).strip().splitlines()
    msg = scrub(" ".join(x.strip() for x in first[:3] if x.strip())[:300] or e.__class__.__name__, token)
    if isinstance(e, RevisionNotFoundError):
        return InputError(f"{what}: revision not found ({msg})", "check --revision")
    if isinstance(e, RepositoryNotFoundError):
        return InputError(f"{what}: repository not found or not writable ({msg})", "check --repo-id and that the token can write to it")
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            return InputError(f"{what}: the Hub refused the token (HTTP {status})", "use a token with write access to the organisation (HF_TOKEN or `hf auth login`)")
        if status is not None and 400 <= status < 500:
            return InputError(f"{what}: the Hub rejected the request (HTTP {status}): {msg}")
        return HubError(f"{what}: the Hub answered HTTP {status}: {msg}")
    if isinstance(e, ValueError):
        return InputError(f"{what}: {msg}")
    from huggingface_hub import constants  # lazy: huggingface_hub (0.2 s), only when uploading

    where = scrub(str(constants.ENDPOINT), token)  # the endpoint is named; credentials in it never are
    return HubError(f"{what} at {where}: {e.__class__.__name__}: {msg}", "check the network (HF_ENDPOINT if you use a mirror) and re-run")


@contextlib.contextmanager
def _quiet_hub_progress(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import (  # lazy: huggingface_hub (0.2 s), only when uploading
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was = are_progress_bars_disabled()
    if not enabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not was and not enabled:
            enable_progress_bars()


def upload(planned: list[tuple[PlannedFile, Path]], repo_id: str, *, private: bool, create_pr: bool, revision: str | None,
           commit_message: str, description: str, token: str | None, say: Callable[[str], None],
           show_bars: bool) -> dict[str, Any]:
    """Upload the planned files (path in repo, file on disk) to ``repo_id`` in one commit; the commit's URLs."""
    from huggingface_hub import CommitOperationAdd, HfApi, constants  # lazy: huggingface_hub (0.2 s), only when uploading

    if constants.is_offline_mode():
        raise InputError("HF_HUB_OFFLINE is set: publishing needs the network", "unset HF_HUB_OFFLINE, or use --dry-run")
    tok = _resolve_token(token)
    api = HfApi(token=tok)
    total = sum(p.size for p, _ in planned)
    with _quiet_hub_progress(enabled=show_bars):
        try:
            say(f"creating {repo_id} on {api.endpoint} if needed")
            repo_url = api.create_repo(repo_id, private=private, exist_ok=True)
        except Exception as e:
            raise _hub_error(e, tok, f"create_repo {repo_id}") from None
        if revision is not None and revision != "main":
            try:
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            except Exception as e:
                raise _hub_error(e, tok, f"create_branch {revision}") from None
        ops = [CommitOperationAdd(path_in_repo=p.path, path_or_fileobj=str(src)) for p, src in planned]
        say(f"uploading {len(ops)} files ({total / 1e6:.1f} MB) in one commit" + (" as a pull request" if create_pr else ""))
        try:
            info = api.create_commit(repo_id, ops, commit_message=commit_message, commit_description=description,
                                     revision=revision, create_pr=create_pr)
        except Exception as e:
            raise _hub_error(e, tok, f"commit to {repo_id}") from None
    return {"repo_url": str(repo_url), "commit_url": info.commit_url, "commit_oid": info.oid, "pr_url": info.pr_url}
