"""Turning a job's URIs into local files the trainer can open: the target checkpoint and the prompts.

    target: bundled:NAME | file:///dir (below the allowed roots, after resolving symlinks) |
            s3://bucket/prefix (judged and credentialed below) | hf://org/name[@revision] (pinned to a commit)
    data:   builtin | file-... (an upload) | file:///x.jsonl | s3://bucket/key.jsonl | hf://org/dataset[@rev]

Before every fetch the URI is judged again by the one scoping rule (domain/storage_scope.py), whatever the API
accepted: the spec is read back from the database, and this worker may see other endpoints and disks than the
API did. Inside Draftsmith's own storage only the organisation's own prefixes are readable (with the service's
credentials); another bucket is read with the organisation's own secret (`s3.<bucket>`, else `s3`), the
deployment's credentials only for DRAFTSMITH_S3_TRUSTED_BUCKETS, else anonymously (`open_s3`). The Hub the same
way (`hub_token`, `choose_hub_access`): the organisation's `hf.<namespace>` or `hf` secret, the deployment's token
only for DRAFTSMITH_HF_TRUSTED_NAMESPACES, else no token at all (public repos).

Only the files a checkpoint needs are fetched (config, safetensors weights and index, tokenizer and chat
template): pickle weights only when the job allows them, Python files only with trust_remote_code. Every
fetch lands in the worker's cache under a name derived from the URI and revision, so later stages and
resumed jobs on this machine reuse it. A failure names the URI and what to fix, never a credential.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.orm import Session, sessionmaker

from domain.redaction import register_secret_values
from domain.secrets import SecretUnavailable, parse_hub_token, parse_s3_credentials, secret_value
from domain.settings import Settings
from domain.storage import organisation_s3_client, s3_client
from domain.storage_scope import (
    HUB_SECRETS_HINT,
    StorageScopeError,
    check_storage_uri,
    choose_hub_access,
    choose_s3_access,
    s3_secret_problems,
    tenant_for,
)
from schemas.bounds import file_uri_path, resolved_path_within_roots
from schemas.prompts import MAX_PROMPTS_PER_JOB
from trainer.errors import DraftsmithError, StageInterrupted, TargetError

CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                    "adapter_config.json")  # a LoRA adapter target (its weights: adapter_model.safetensors)
PICKLE_FILES = ("*.bin", "*.pt", "*.pth", "pytorch_model.bin.index.json")
CODE_FILES = ("*.py",)


PRIVATE_BUCKET_HINT = ("check the bucket and key; a private bucket is read with your organisation's own credentials: "
                       "store them as the secret s3.<bucket> or s3 (PUT /v1/secrets/NAME)")
PRIVATE_REPO_HINT = f"check the repo id and revision; a private repo is read with your organisation's own token: " \
    f"{HUB_SECRETS_HINT}"


class TargetNotFound(TargetError):
    code = "target_not_found"


class TargetNotAllowed(TargetError):
    code = "target_not_allowed"


class SourceUnavailable(DraftsmithError):
    code = "source_unavailable"


class StorageNotAllowed(DraftsmithError):
    """A URI this organisation may not use (another organisation's objects, the service's own storage as a
    destination, a bucket without credentials): refused before anything is read or written."""

    code = "storage_not_allowed"


@dataclass(frozen=True)
class Caller:
    """The organisation a fetch or publish is for, and the database to ask about its jobs and secrets."""

    org_id: str
    session_factory: sessionmaker[Session]


@dataclass(frozen=True)
class S3Handle:
    """A client for one URI under the scoping rule, with what its caches and messages need to know."""

    client: Any
    bucket: str
    key: str
    scrub: list[str]
    """Credential values in use, kept out of messages."""
    identity: str
    """Who reads, and where: the deployment's credentials, none, or a secret's key id at its endpoint. Cached
    bytes are keyed by it (with the organisation), so one identity never receives what another fetched."""


def open_s3(uri: str, settings: Settings, caller: Caller, *, what: str, write: bool = False,
            explicit_secret: str | None = None) -> S3Handle:
    """A client for `uri` with the credentials the scoping rule allows. Raises StorageNotAllowed naming `what` and
    the fix."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    deployment = f"deployment@{settings.s3_endpoint_url or 'aws'}"
    with caller.session_factory() as session:
        tenant = tenant_for(session, caller.org_id)
        try:
            if check_storage_uri(uri, settings, tenant, write=write) is not None:  # its own objects in our storage
                return S3Handle(s3_client(settings), bucket, key, [], deployment)
            access = choose_s3_access(bucket, settings, tenant.secret_names(), explicit_secret=explicit_secret,
                                      write=write)
            if access.kind == "deployment":
                return S3Handle(s3_client(settings), bucket, key, [], deployment)
            if access.kind == "anonymous":
                return S3Handle(s3_client(settings, anonymous=True), bucket, key, [], f"anonymous@{deployment}")
            assert access.secret is not None
            raw = secret_value(session, settings, caller.org_id, access.secret)
            register_secret_values(raw)  # kept out of every log line of this process
            credentials = parse_s3_credentials(raw, access.secret)
            register_secret_values(credentials["secret_access_key"])
            # Judged before every use (a secret stored under an older rule, a name that resolves elsewhere now);
            # the client judges every connection again (domain/egress.py).
            problems = s3_secret_problems(credentials, settings)
            if problems:
                field, problem = problems[0]
                raise StorageScopeError(f"{uri}: your secret {access.secret!r}, {field}: {problem} (store it again "
                                        f"with PUT /v1/secrets/{access.secret})")
        except StorageScopeError as exc:
            raise StorageNotAllowed(f"{what}: {exc}") from None
        except SecretUnavailable as exc:
            raise StorageNotAllowed(f"{what} {uri}: {exc}") from None
    field = f"the endpoint_url of your secret {access.secret!r} (PUT /v1/secrets/{access.secret})"
    client = organisation_s3_client(settings, **credentials, endpoint_setting=field)  # type: ignore[arg-type]
    identity = "|".join(("secret", str(credentials["endpoint_url"] or "aws"), str(credentials["region"] or ""),
                         str(credentials["access_key_id"]),
                         hashlib.sha256(str(credentials["secret_access_key"]).encode()).hexdigest()))
    return S3Handle(client, bucket, key, [raw, str(credentials["secret_access_key"])], identity)


def fetch_cache(cache: Path, caller: Caller, kind: str, *identity: str) -> Path:
    """Where fetched bytes of `kind` live for this organisation and identity (who read them, from where, which
    URI). Never shared across organisations: another organisation naming the same URI, even one whose endpoint
    holds a look-alike object, fetches its own copy with its own credentials."""
    digest = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:24]
    return cache / "orgs" / caller.org_id / kind / digest


def hub_token(repo: str, settings: Settings, caller: Caller, *, what: str, write: bool = False,
              explicit_secret: str | None = None) -> str | Literal[False]:
    """The token a Hub request for `repo` (`namespace/name`) may carry under the rule (domain/storage_scope.py): the
    organisation's own secret, the deployment's token for a trusted namespace, else False, which huggingface_hub
    takes as "no Authorization header" (None would send a token this machine has: HF_TOKEN, a cached login).
    Raises StorageNotAllowed naming `what` and the fix."""
    with caller.session_factory() as session:
        try:
            access = choose_hub_access(repo, settings, tenant_for(session, caller.org_id).secret_names(),
                                       explicit_secret=explicit_secret, write=write)
            if access.kind == "anonymous":
                return False
            if access.kind == "deployment":
                assert settings.hf_token is not None  # choose_hub_access lends only a token it has
                token = settings.hf_token.get_secret_value()
            else:
                assert access.secret is not None
                token = parse_hub_token(secret_value(session, settings, caller.org_id, access.secret), access.secret)
        except StorageScopeError as exc:
            raise StorageNotAllowed(f"{what}: {exc}") from None
        except SecretUnavailable as exc:
            raise StorageNotAllowed(f"{what} hf://{repo}: {exc}") from None
    register_secret_values(token)  # kept out of every log line of this process
    return token


def check_local(uri: str, settings: Settings, caller: Caller, what: str) -> None:
    """The scoping rule for a file:// URI (into the local storage root, or the worker's cache)."""
    with caller.session_factory() as session:
        try:
            check_storage_uri(uri, settings, tenant_for(session, caller.org_id))
        except StorageScopeError as exc:
            raise StorageNotAllowed(f"{what}: {exc}") from None


@dataclass(frozen=True)
class Resolved:
    path: str
    """What the trainer opens: a local path, or a bundled name / `builtin`."""
    revision: str | None = None
    """The exact version fetched (Hub commit sha, or a digest of the S3 objects' ETags)."""


ShouldStop = Callable[[], bool]
"""The stage's cancellation poll (StageReporter.should_stop): a download asks it as its bytes arrive."""


def stop_check(should_stop: ShouldStop | None, what: str) -> Callable[..., None]:
    """A callback for a download's progress (boto3's `Callback`, a tqdm `update`) that stops it mid-file once the
    stage is asked to stop, so a cancel is honoured within seconds of the next chunk, not after a 100 GB target.
    What was fetched stays in the cache: S3 files are re-fetched whole, the Hub resumes its partial files."""
    def check(*_args) -> None:
        if should_stop is not None and should_stop():
            raise StageInterrupted(f"{what}: the download stopped on request (the job was cancelled or handed "
                                   "over); the files fetched so far stay in this worker's cache")
    return check


def resolve_target(uri: str, settings: Settings, cache: Path, *, caller: Caller, allow_pickle: bool = False,
                   trust_remote_code: bool = False, should_stop: ShouldStop | None = None) -> Resolved:
    patterns = CHECKPOINT_FILES + (PICKLE_FILES if allow_pickle else ()) + (CODE_FILES if trust_remote_code else ())
    if uri.startswith("bundled:"):
        return Resolved(uri.removeprefix("bundled:"))
    if uri.startswith("file:"):
        path = local_file(uri, settings, "target", caller)
        if not Path(path).is_dir():
            raise TargetNotFound(f"target {uri}: no such directory on the worker; give a model directory below "
                                 f"the allowed roots ({', '.join(settings.allowed_file_roots) or 'none'})")
        return Resolved(path)
    if uri.startswith("s3://"):
        return _fetch_s3_prefix(uri, settings, cache / "targets", patterns, caller, stop_check(should_stop, "target"))
    if uri.startswith("hf://"):
        return _fetch_hub(uri, settings, cache / "targets", patterns, repo_type="model", caller=caller,
                          check=stop_check(should_stop, "target"))
    raise TargetNotFound(f"target {uri!r}: unsupported scheme")


def resolve_prompts(source: str, settings: Settings, cache: Path, *, caller: Caller, count: int | None = None,
                    uploaded_key: str | None = None, storage=None, should_stop: ShouldStop | None = None) -> Resolved:
    """`uploaded_key`: the storage key of an uploaded `file-...` (the caller looked it up in the org's files).
    `count`: the job's data.count; without one a fetched source may hold at most MAX_PROMPTS_PER_JOB prompts."""
    if source == "builtin":
        return Resolved("builtin")
    if source.startswith("file-"):
        local = cache / "orgs" / caller.org_id / "files" / f"{source}.jsonl"
        if not local.is_file():
            storage.get_file(uploaded_key, local)
        return Resolved(str(local))  # counted (and capped) when it was uploaded
    if source.startswith("file:"):
        path = local_file(source, settings, "prompts file", caller)
        if not Path(path).is_file():
            raise SourceUnavailable(f"prompts file {source}: no such file on the worker")
        resolved = Resolved(path)
    elif source.startswith("s3://"):
        resolved = _fetch_s3_object(source, settings, cache / "prompts", caller, stop_check(should_stop, "prompts"))
    elif source.startswith("hf://"):
        fetched = _fetch_hub(source, settings, cache / "prompts", ("*.jsonl",), repo_type="dataset",
                             caller=caller, check=stop_check(should_stop, "prompts"))
        files = sorted(Path(fetched.path).rglob("*.jsonl"))
        chosen = next((f for f in files if f.name == "prompts.jsonl"), files[0] if len(files) == 1 else None)
        if chosen is None:
            raise SourceUnavailable(f"prompts {source}: the dataset repo needs one .jsonl file (or prompts.jsonl); "
                                    f"found {len(files)}")
        resolved = Resolved(str(chosen), fetched.revision)
    else:
        raise SourceUnavailable(f"prompts {source!r}: unsupported source")
    if count is None:
        _refuse_oversized(resolved.path, source)
    return resolved


def _refuse_oversized(path: str, source: str) -> None:
    """A job takes every prompt of its source when data.count is null: at most MAX_PROMPTS_PER_JOB of them."""
    prompts = 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                prompts += 1
                if prompts > MAX_PROMPTS_PER_JOB:
                    raise SourceUnavailable(
                        f"prompts {source}: more than {MAX_PROMPTS_PER_JOB} prompts, the most one job takes; set "
                        f"data.count (at most {MAX_PROMPTS_PER_JOB}) to draw a sample, or split the source")


def local_file(uri: str, settings: Settings, what: str, caller: Caller) -> str:
    """The real path of a file:// URI, refused unless it lies below an allowed root once symlinks are resolved
    (a link inside a root that points outside it is refused), and outside other organisations' objects in a
    local storage root and the worker's cache (the scoping rule)."""
    try:
        path = os.path.realpath(file_uri_path(uri))
    except ValueError as exc:
        raise TargetNotAllowed(f"{what}: {exc}") from None
    # Checked again here, not only at admission: the link may have changed since, or point elsewhere on this disk.
    if not resolved_path_within_roots(path, settings.allowed_file_roots):
        raise TargetNotAllowed(f"{what} {uri} resolves to {path}, outside the allowed roots "
                               f"({', '.join(settings.allowed_file_roots) or 'none configured'}); move it below one "
                               "or ask the operator to allow its directory (DRAFTSMITH_ALLOWED_FILE_ROOTS)")
    check_local(uri, settings, caller, what)  # as written and as resolved now
    check_local(Path(path).as_uri(), settings, caller, what)  # the very path that is opened
    return path


def _fetch_s3_prefix(uri: str, settings: Settings, cache: Path, patterns: tuple[str, ...],
                     caller: Caller, check: Callable[..., None] = stop_check(None, "target")) -> Resolved:
    from botocore.exceptions import BotoCoreError, ClientError

    handle = open_s3(uri, settings, caller, what="target")
    client, bucket, prefix = handle.client, handle.bucket, handle.key.strip("/")
    try:
        objects = [item for page in client.get_paginator("list_objects_v2").paginate(
                   Bucket=bucket, Prefix=f"{prefix}/" if prefix else "") for item in page.get("Contents", [])]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        error = TargetNotFound if code in ("NoSuchBucket", "404") else SourceUnavailable
        raise error(f"target {uri}: S3 answered {code}; {PRIVATE_BUCKET_HINT}") from None
    except BotoCoreError as exc:
        raise SourceUnavailable(f"target {uri}: S3 is unreachable ({type(exc).__name__})") from None
    wanted = [item for item in objects if "/" not in item["Key"][len(prefix) + 1 if prefix else 0:]
              and any(fnmatch.fnmatch(item["Key"].rsplit("/", 1)[-1], p) for p in patterns)]
    if not wanted:
        raise TargetNotFound(f"target {uri}: no checkpoint files under this prefix (expected config.json, "
                             "*.safetensors and tokenizer files)")
    revision = hashlib.sha256("".join(sorted(i["Key"] + i["ETag"] for i in wanted)).encode()).hexdigest()[:16]
    local = fetch_cache(cache, caller, "s3", handle.identity, uri) / revision
    for item in wanted:
        file = local / item["Key"].rsplit("/", 1)[-1]
        if not (file.is_file() and file.stat().st_size == item["Size"]):
            file.parent.mkdir(parents=True, exist_ok=True)
            check()
            client.download_file(bucket, item["Key"], str(file), Callback=check)
    return Resolved(str(local), revision)


def _fetch_s3_object(uri: str, settings: Settings, cache: Path, caller: Caller,
                     check: Callable[..., None] = stop_check(None, "prompts")) -> Resolved:
    from botocore.exceptions import BotoCoreError, ClientError

    handle = open_s3(uri, settings, caller, what="prompts")
    client, bucket, key = handle.client, handle.bucket, handle.key
    try:
        head = client.head_object(Bucket=bucket, Key=key)
        # Keyed by who read it and by the object's version (ETag): a changed object is fetched again.
        version = hashlib.sha256(f"{head.get('ETag', '')}|{head['ContentLength']}".encode()).hexdigest()[:16]
        local = fetch_cache(cache, caller, "s3", handle.identity, uri) / version / key.rsplit("/", 1)[-1]
        if not (local.is_file() and local.stat().st_size == head["ContentLength"]):
            local.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(local), Callback=check)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise SourceUnavailable(f"prompts {uri}: S3 answered {code}; {PRIVATE_BUCKET_HINT}") from None
    except BotoCoreError as exc:
        raise SourceUnavailable(f"prompts {uri}: S3 is unreachable ({type(exc).__name__})") from None
    return Resolved(str(local), head.get("ETag", "").strip('"') or None)


def _fetch_hub(uri: str, settings: Settings, cache: Path, patterns: tuple[str, ...], *, repo_type: str,
               caller: Caller, what: str | None = None, check: Callable[..., None] | None = None) -> Resolved:
    """Pin the revision to a commit first, then download only the allowed files of that commit, both with the token
    the rule chooses for this organisation (`hub_token`). The pinning request always goes out with that token, so
    a commit another organisation's token fetched into this cache is never handed to one that cannot read it."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    repo, _, revision = uri.removeprefix("hf://").partition("@")
    what = what or ("target" if repo_type == "model" else "prompts")
    token = hub_token(repo, settings, caller, what=what)
    try:
        info = HfApi(endpoint=settings.hf_endpoint, token=token).repo_info(repo, revision=revision or None,
                                                                           repo_type=repo_type)
        local = fetch_cache(cache, caller, "hub", str(settings.hf_endpoint), repo_type, repo) / info.sha
        snapshot_download(repo, revision=info.sha, repo_type=repo_type, allow_patterns=list(patterns),
                          local_dir=local, endpoint=settings.hf_endpoint, token=token,
                          tqdm_class=_stopping_progress(check) if check is not None else None)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise TargetNotFound(f"{what} {uri}: the Hub has no such repo or revision, or it is private; "
                             f"{PRIVATE_REPO_HINT}") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "no answer"
        raise SourceUnavailable(f"{what} {uri}: the Hub answered {status}; {PRIVATE_REPO_HINT}") from None
    return Resolved(str(local), info.sha)


def _stopping_progress(check: Callable[..., None]):
    """huggingface_hub's progress bar, asking `check` at every update: snapshot_download sums each file's chunks
    into it from its download threads, so a stop request ends the download at the next chunk."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class StoppingProgress(hub_tqdm):
        def update(self, n=1):
            check()
            return super().update(n)

    return StoppingProgress
