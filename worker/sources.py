"""Turning a job's URIs into local files the trainer can open: the target checkpoint and the prompts.

    target: bundled:NAME | file:///dir (below the allowed roots, after resolving symlinks) |
            s3://bucket/prefix (the deployment's S3 settings) | hf://org/name[@revision] (pinned to a commit)
    data:   builtin | file-... (an upload) | file:///x.jsonl | s3://bucket/key.jsonl | hf://org/dataset[@rev]

Only the files a checkpoint needs are fetched (config, safetensors weights and index, tokenizer and chat
template): pickle weights only when the job allows them, Python files only with trust_remote_code. Every
fetch lands in the worker's cache under a name derived from the URI and revision, so later stages and
resumed jobs on this machine reuse it. A failure names the URI and what to fix, never a credential.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from api.settings import Settings
from api.storage import s3_client
from schemas.bounds import resolved_path_within_roots
from trainer.errors import DraftsmithError, TargetError

CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json")
PICKLE_FILES = ("*.bin", "*.pt", "*.pth", "pytorch_model.bin.index.json")
CODE_FILES = ("*.py",)


class TargetNotFound(TargetError):
    code = "target_not_found"


class TargetNotAllowed(TargetError):
    code = "target_not_allowed"


class SourceUnavailable(DraftsmithError):
    code = "source_unavailable"


@dataclass(frozen=True)
class Resolved:
    path: str
    """What the trainer opens: a local path, or a bundled name / `builtin`."""
    revision: str | None = None
    """The exact version fetched (Hub commit sha, or a digest of the S3 objects' ETags)."""


def resolve_target(uri: str, settings: Settings, cache: Path, *, allow_pickle: bool = False,
                   trust_remote_code: bool = False) -> Resolved:
    patterns = CHECKPOINT_FILES + (PICKLE_FILES if allow_pickle else ()) + (CODE_FILES if trust_remote_code else ())
    if uri.startswith("bundled:"):
        return Resolved(uri.removeprefix("bundled:"))
    if uri.startswith("file://"):
        path = local_file(uri, settings, "target")
        if not Path(path).is_dir():
            raise TargetNotFound(f"target {uri}: no such directory on the worker; give a model directory below "
                                 f"the allowed roots ({', '.join(settings.allowed_file_roots) or 'none'})")
        return Resolved(path)
    if uri.startswith("s3://"):
        return _fetch_s3_prefix(uri, settings, cache / "targets", patterns)
    if uri.startswith("hf://"):
        return _fetch_hub(uri, settings, cache / "targets", patterns, repo_type="model")
    raise TargetNotFound(f"target {uri!r}: unsupported scheme")


def resolve_prompts(source: str, settings: Settings, cache: Path, *, uploaded_key: str | None = None,
                    storage=None) -> Resolved:
    """`uploaded_key`: the storage key of an uploaded `file-...` (the caller looked it up in the org's files)."""
    if source == "builtin":
        return Resolved("builtin")
    if source.startswith("file-"):
        local = cache / "files" / f"{source}.jsonl"
        if not local.is_file():
            storage.get_file(uploaded_key, local)
        return Resolved(str(local))
    if source.startswith("file://"):
        path = local_file(source, settings, "prompts file")
        if not Path(path).is_file():
            raise SourceUnavailable(f"prompts file {source}: no such file on the worker")
        return Resolved(path)
    if source.startswith("s3://"):
        return _fetch_s3_object(source, settings, cache / "prompts")
    if source.startswith("hf://"):
        fetched = _fetch_hub(source, settings, cache / "prompts", ("*.jsonl",), repo_type="dataset")
        files = sorted(Path(fetched.path).rglob("*.jsonl"))
        chosen = next((f for f in files if f.name == "prompts.jsonl"), files[0] if len(files) == 1 else None)
        if chosen is None:
            raise SourceUnavailable(f"prompts {source}: the dataset repo needs one .jsonl file (or prompts.jsonl); "
                                    f"found {len(files)}")
        return Resolved(str(chosen), fetched.revision)
    raise SourceUnavailable(f"prompts {source!r}: unsupported source")


def local_file(uri: str, settings: Settings, what: str) -> str:
    """The real path of a file:// URI, refused unless it lies below an allowed root once symlinks are resolved
    (a link inside a root that points outside it is refused)."""
    path = os.path.realpath(unquote(uri.removeprefix("file://")))
    # Checked again here, not only at admission: the link may have changed since, or point elsewhere on this disk.
    if not resolved_path_within_roots(path, settings.allowed_file_roots):
        raise TargetNotAllowed(f"{what} {uri} resolves to {path}, outside the allowed roots "
                               f"({', '.join(settings.allowed_file_roots) or 'none configured'}); move it below one "
                               "or ask the operator to allow its directory (DRAFTSMITH_ALLOWED_FILE_ROOTS)")
    return path


def _fetch_s3_prefix(uri: str, settings: Settings, cache: Path, patterns: tuple[str, ...]) -> Resolved:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    client = s3_client(settings)
    try:
        objects = [item for page in client.get_paginator("list_objects_v2").paginate(
                   Bucket=bucket, Prefix=f"{prefix}/" if prefix else "") for item in page.get("Contents", [])]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        error = TargetNotFound if code in ("NoSuchBucket", "404") else SourceUnavailable
        raise error(f"target {uri}: S3 answered {code}; check the bucket name and the worker's S3 settings") from None
    except BotoCoreError as exc:
        raise SourceUnavailable(f"target {uri}: S3 is unreachable ({type(exc).__name__})") from None
    wanted = [item for item in objects if "/" not in item["Key"][len(prefix) + 1 if prefix else 0:]
              and any(fnmatch.fnmatch(item["Key"].rsplit("/", 1)[-1], p) for p in patterns)]
    if not wanted:
        raise TargetNotFound(f"target {uri}: no checkpoint files under this prefix (expected config.json, "
                             "*.safetensors and tokenizer files)")
    revision = hashlib.sha256("".join(sorted(i["Key"] + i["ETag"] for i in wanted)).encode()).hexdigest()[:16]
    local = cache / "s3" / f"{hashlib.sha256(uri.encode()).hexdigest()[:16]}-{revision}"
    for item in wanted:
        file = local / item["Key"].rsplit("/", 1)[-1]
        if not (file.is_file() and file.stat().st_size == item["Size"]):
            file.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item["Key"], str(file))
    return Resolved(str(local), revision)


def _fetch_s3_object(uri: str, settings: Settings, cache: Path) -> Resolved:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    local = cache / "s3" / hashlib.sha256(uri.encode()).hexdigest()[:16] / key.rsplit("/", 1)[-1]
    try:
        head = s3_client(settings).head_object(Bucket=bucket, Key=key)
        if not (local.is_file() and local.stat().st_size == head["ContentLength"]):
            local.parent.mkdir(parents=True, exist_ok=True)
            s3_client(settings).download_file(bucket, key, str(local))
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise SourceUnavailable(f"prompts {uri}: S3 answered {code}; check the key and the worker's S3 "
                                "settings") from None
    except BotoCoreError as exc:
        raise SourceUnavailable(f"prompts {uri}: S3 is unreachable ({type(exc).__name__})") from None
    return Resolved(str(local), head.get("ETag", "").strip('"') or None)


def _fetch_hub(uri: str, settings: Settings, cache: Path, patterns: tuple[str, ...], *, repo_type: str) -> Resolved:
    """Pin the revision to a commit first, then download only the allowed files of that commit."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    repo, _, revision = uri.removeprefix("hf://").partition("@")
    token = settings.hf_token.get_secret_value() if settings.hf_token else None
    what = "target" if repo_type == "model" else "prompts"
    try:
        info = HfApi(endpoint=settings.hf_endpoint, token=token).repo_info(repo, revision=revision or None,
                                                                           repo_type=repo_type)
        local = cache / "hub" / repo.replace("/", "--") / info.sha
        snapshot_download(repo, revision=info.sha, repo_type=repo_type, allow_patterns=list(patterns),
                          local_dir=local, endpoint=settings.hf_endpoint, token=token)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise TargetNotFound(f"{what} {uri}: the Hub has no such repo or revision (or it is private and the "
                             "deployment's token cannot read it)") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "no answer"
        raise SourceUnavailable(f"{what} {uri}: the Hub answered {status}") from None
    return Resolved(str(local), info.sha)
