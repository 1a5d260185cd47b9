"""Which storage a URI in a spec may reach, and with whose credentials.

The deployment's own storage (`storage_url`: an S3 bucket and prefix, or a local directory) holds every
organisation's uploads, work files and artifacts, and the service reads and writes it with its own credentials.
A spec that could name objects there by URI would make the service a confused deputy: organisation B trains on
A's prompts, or publishes over A's artifacts. `check_storage_uri` is the one rule. The API calls it when a spec
is accepted (a job, an audit, a publish destination; `check_spec_storage`) and the worker again before every
fetch and every publish, since specs are stored (a row can be edited) and a worker may see other endpoints.

- A URI *reaches the deployment's storage* when any reasonable reading of it names the deployment's bucket on
  the deployment's endpoint: the bucket in any case; virtual-host spellings (`bucket.s3.amazonaws.com`,
  `bucket.<endpoint host>`, as a bucket name or as an endpoint); a path-style spelling
  (`s3://<endpoint host>/<bucket>/...`); an alias of the endpoint (another name or address of the same server;
  any AWS S3 endpoint when the deployment is on AWS, where bucket names are global; every spelling of a host, numeric
  IPv4 forms and IPv4-in-IPv6 included: domain/s3_endpoints.py); through the path of the deployment's endpoint
  (botocore puts that path before the bucket). These are readings of the URI's text by our own server. A `file://` URI reaches it
  when the path resolves (symbolic links included) into the local storage root. Readings are taken together:
  one that lands in the deployment's storage decides.
- Such a URI is accepted for *reading* only when it is spelled plainly (the storage prefix, then segments of
  letters, digits, '.', '_', '-': no `//`, `%`-escapes, `.`/`..` segments, other case) and lies under one of the
  caller's own prefixes: `files/<its org id>/` or `jobs/<one of its job ids>/`. (Keys keep job ids at the top
  level, so "the organisation's prefix" is that pair; moving every stored object under `orgs/<id>/` would need a
  data migration for the same guarantee.) It is never accepted as a *publish destination*: the service's
  storage is written by the service only, and registered artifacts carry the sha256s downloads are checked
  against, even one's own.
- `file://` URIs into the worker's cache (`worker_cache_dir`: every job it ran, uploaded files by id) are
  refused outright; nobody has a reason to name it.
- Objects of one organisation are reachable by another only through an explicit, audited share (none yet).

Other buckets (`choose_s3_access`): the deployment's credentials are never lent to them, unless the operator
lists the bucket in `s3_trusted_buckets` (a shared models bucket, say; `*` in a development setup, whose one
organisation is the operator). An organisation reads its own buckets
with its own secret: the one a publish destination names (`credentials_secret`), else a secret named
`s3.<bucket>`, else one named `s3`; without one a read is anonymous (public buckets only) and a publish refused
(`choose_access` is the order).
A secret's own endpoint is judged by the address it reaches, not by how it is spelled (`check_s3_endpoint`, the
egress policy of domain/egress.py): at PUT /v1/secrets, in the worker before every use, and by the client itself
at every connection. It can never reach the deployment's storage server, so no reading of a URI through it can
land in our bucket; and an organisation's credentials are never sent to the deployment's endpoint (a secret
without `endpoint_url` means AWS).

The Hugging Face Hub (`choose_hub_access`) is an outside store of the same kind: the deployment's `hf_token` may
read private repos, or write to namespaces, that no customer should reach through the service. A Hub request
carries the token secret a publish destination names (`token_secret`), else the organisation's secret
`hf.<namespace>` (the repo's namespace, lowercase: `hf://Acme/llama` -> `hf.acme`), else the deployment's token
only for a namespace the operator lists in `hf_trusted_namespaces` (`*` in development), else the organisation's
`hf`, else no token at all: enough for public repos, never for a publish. A Hub secret's value is the token itself.
The API cannot tell whether a repo it would read is private, so it judges only Hub publish destinations
(`check_spec_storage`); the worker chooses the token before every fetch and publish (worker/sources.hub_token),
and sends none as `token=False`, so huggingface_hub does not fall back to a token of the machine's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from domain.s3_endpoints import endpoint_path, is_endpoint_host, virtual_host_label
from domain.settings import Settings
from domain.storage import check_key
from schemas.bounds import file_uri_path

_SECRET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")  # schemas.job_spec.SECRET_NAME_PATTERN
DEFAULT_S3_SECRET = "s3"
DEFAULT_HUB_SECRET = "hf"
HUB_SECRETS_HINT = ("store your own Hub token as the secret hf.<namespace> or hf (PUT /v1/secrets/NAME; the value is "
                    "the token)")
OWN_PREFIXES_HINT = "files/<your organisation id>/ or jobs/<one of your job ids>/"


class StorageScopeError(ValueError):
    """The URI may not be used by this organisation; the message says why and what to do instead."""


class CredentialsNeeded(StorageScopeError):
    """A publish destination outside the trusted buckets, without the organisation's own credentials."""


@dataclass(frozen=True)
class Tenant:
    """Whose spec this is: the organisation, which job ids are its own, which secrets it has stored."""

    org_id: str
    owns_job: Callable[[str], bool]
    secret_names: Callable[[], Collection[str]]


@dataclass(frozen=True)
class DeploymentObject:
    """A URI that lies in the deployment's own storage, under the caller's prefix: the storage key to use."""

    key: str


# --- readings of an s3:// URI -----------------------------------------------------------------------------------


def _s3_readings(bucket: str, key: str, endpoint_url: str | None) -> list[tuple[str, str]]:
    """The (bucket, key) pairs an S3-compatible server at `endpoint_url` might take `s3://bucket/key` for."""
    readings = [(bucket, key)]
    for index, char in enumerate(bucket):  # `name.<endpoint host>` spelled as a bucket: virtual-host style
        if char == "." and is_endpoint_host(bucket[index + 1:], endpoint_url):
            readings.append((bucket[:index], key))
    if is_endpoint_host(bucket, endpoint_url):  # `s3://<endpoint host>/<bucket>/key`: path style
        first, _, rest = key.lstrip("/").partition("/")
        readings.append((first, rest))
    path = endpoint_path(endpoint_url)
    if path:  # an endpoint with a path: the request goes to /<path>/<bucket>/<key>, its first segment the bucket
        readings.append((path[0], "/".join([*path[1:], bucket, key])))
    label = virtual_host_label(endpoint_url)
    if label is not None:  # the endpoint itself virtual-host style: `http://<bucket>.<server>` + path /bucket/key
        readings.append((label, "/".join([*path, bucket, key])))
    return readings


def _deployment_bucket(settings: Settings) -> tuple[str, str] | None:
    if not settings.storage_url.startswith("s3://"):
        return None
    bucket, _, prefix = settings.storage_url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def _own_key(relative: str, tenant: Tenant, uri: str) -> str:
    """`relative` (a key below the storage prefix) if it lies under one of the tenant's prefixes."""
    plain = relative[:-1] if relative.endswith("/") else relative
    try:
        check_key(plain)
    except ValueError:
        raise StorageScopeError(
            f"{uri} lies in Draftsmith's own storage, and there only plainly spelled keys under your organisation's "
            f"prefixes are reachable ({OWN_PREFIXES_HINT}); write the key without '//', '%' escapes or '.' "
            "segments") from None
    parts = plain.split("/")
    owned = len(parts) >= 2 and (
        (parts[0] == "files" and parts[1] == tenant.org_id) or (parts[0] == "jobs" and tenant.owns_job(parts[1])))
    if not owned:
        raise StorageScopeError(
            f"{uri} lies in Draftsmith's own storage outside your organisation's prefixes ({OWN_PREFIXES_HINT}); "
            "another organisation's objects are not reachable. Use your own uploads (data.source = a file id), "
            "drafters (drf_...) or buckets")
    return plain


def _check_s3(uri: str, settings: Settings, tenant: Tenant, *, write: bool) -> DeploymentObject | None:
    deployment = _deployment_bucket(settings)
    if deployment is None:
        return None
    storage_bucket, prefix = deployment
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    # Read as the deployment's endpoint would take it. An organisation's own endpoint never reaches that server
    # (the egress policy refuses its addresses), so its readings need no judging here.
    hits = {(b, k) for b, k in _s3_readings(bucket, key, settings.s3_endpoint_url)
            if b.lower() == storage_bucket.lower()}
    if not hits:
        return None
    if write:
        raise StorageScopeError(f"{uri} lies in Draftsmith's own storage, which only the service writes; publish "
                                "to a bucket of your own (its artifacts are already downloadable from Draftsmith)")
    if (bucket, key) not in hits or bucket != storage_bucket:
        raise StorageScopeError(f"{uri} spells Draftsmith's own storage in another way; write it as "
                                f"s3://{storage_bucket}/{prefix + '/' if prefix else ''}<key>, under "
                                f"{OWN_PREFIXES_HINT}")
    if prefix and not key.startswith(prefix + "/"):
        raise StorageScopeError(f"{uri} lies in Draftsmith's own bucket outside its storage prefix; only "
                                f"s3://{storage_bucket}/{prefix}/ + {OWN_PREFIXES_HINT} is reachable")
    return DeploymentObject(_own_key(key[len(prefix) + 1:] if prefix else key, tenant, uri))


# --- an organisation's own S3 endpoint -------------------------------------------------------------------------

S3_SECRET_SHAPE = '{"access_key_id", "secret_access_key", "endpoint_url"?, "region"?}'
_REGION_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$")  # botocore's own region rule


def check_s3_endpoint(endpoint_url: str, settings: Settings) -> None:
    """Refuse (StorageScopeError, with the fix) an S3 secret's endpoint that is not a plain http(s) URL, or whose
    host resolves to an address the egress policy refuses: this deployment's own storage, database or broker at
    any address of theirs, loopback, link-local, private and IPv4-carrying IPv6 addresses (domain/egress.py). A
    path is allowed (some S3-compatible services live under one): no path on another server leads into our
    bucket. The worker's client checks every connection again (a name may resolve elsewhere later)."""
    from domain.egress import EgressPolicy, EgressRefused, url_syntax_problem

    parts = urlsplit(endpoint_url)
    problem = url_syntax_problem(endpoint_url)
    if problem is None and (parts.query or parts.fragment):
        problem = "must not carry a query or a fragment"
    if problem:
        raise StorageScopeError(f"endpoint_url {endpoint_url!r} {problem}; write it as https://host[:port] and put "
                                "the keys in access_key_id and secret_access_key")
    try:
        EgressPolicy.from_settings(settings).check_url(endpoint_url)
    except EgressRefused as exc:
        raise StorageScopeError(f"endpoint_url {endpoint_url!r}: {exc}. Give your own S3-compatible server's public "
                                "address (https://host[:port]); Draftsmith's own storage is reached by uploads "
                                "(POST /v1/files) and drafter ids, never through a secret") from None


def s3_secret_problems(given: dict[str, Any], settings: Settings) -> list[tuple[str, str]]:
    """What is wrong with an S3 secret's JSON, as (field of the value, message with the fix); [] when usable.
    The API asks at PUT /v1/secrets, the worker again before every use (a secret stored before this rule, or a
    deployment whose storage moved since)."""
    problems = [(field, f"required: a non-empty string; an S3 secret is {S3_SECRET_SHAPE}")
                for field in ("access_key_id", "secret_access_key")
                if not isinstance(given.get(field), str) or not given.get(field)]
    endpoint = given.get("endpoint_url")
    if not isinstance(endpoint, str | None):
        problems.append(("endpoint_url", "a string: https://host[:port] of your S3-compatible server"))
    elif endpoint:
        try:
            check_s3_endpoint(endpoint, settings)
        except StorageScopeError as exc:
            problems.append(("endpoint_url", str(exc)))
    region = given.get("region")
    if region not in (None, "") and not (isinstance(region, str) and _REGION_RE.match(region)):
        problems.append(("region", "a region name such as us-east-1: letters, digits and '-', at most 63"))
    return problems


# --- file:// ----------------------------------------------------------------------------------------------------


def _local_path(uri: str) -> str:
    """schemas/bounds.py `file_uri_path`, the one parser of file URIs, refusing as this rule does
    (StorageScopeError, which its callers answer)."""
    try:
        return file_uri_path(uri)
    except ValueError as exc:
        raise StorageScopeError(str(exc)) from None


def _inside(path: str, root: str) -> str | None:
    """`path` relative to `root` when it lies at or below it (compared without case, as a case-insensitive
    filesystem would), else None."""
    folded, folded_root = path.casefold(), root.rstrip("/").casefold()
    if folded == folded_root:
        return ""
    if folded.startswith(folded_root + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return None


def _check_file(uri: str, settings: Settings, tenant: Tenant, *, write: bool) -> DeploymentObject | None:
    path = _local_path(uri)
    candidates = {os.path.normpath(path), os.path.realpath(path)}  # as written, and where it really leads
    cache = os.path.realpath(settings.worker_cache_dir)
    if any(_inside(candidate, cache) is not None for candidate in candidates):
        raise StorageScopeError(f"{uri} lies in the worker's cache, which holds other jobs' files; give a path "
                                "below the allowed roots outside it")
    if not settings.storage_url.startswith("file://"):
        return None
    root = os.path.realpath(_local_path(settings.storage_url))
    relative = next((r for r in (_inside(c, root) for c in candidates) if r is not None), None)
    if relative is None:
        return None
    if write:
        raise StorageScopeError(f"{uri} lies in Draftsmith's own storage, which only the service writes")
    real_relative = _inside(os.path.realpath(path), root)
    if real_relative is None:  # written inside, but a link leads out: judge what is really read
        return None
    return DeploymentObject(_own_key(real_relative, tenant, uri))


def check_storage_uri(uri: str, settings: Settings, tenant: Tenant, *, write: bool = False) -> DeploymentObject | None:
    """The rule (module docstring). Returns where in the deployment's storage the URI lies (under the tenant's
    own prefix) or None when it lies elsewhere; raises StorageScopeError when it may not be used."""
    if uri.lower().startswith("s3://"):
        return _check_s3(uri, settings, tenant, write=write)
    if uri.lower().startswith("file:"):
        return _check_file(uri, settings, tenant, write=write)
    return None  # hf://, bundled:, builtin, file-..., drf_...: not storage, or checked by id and organisation


# --- credentials for other buckets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """Whose credentials one request carries: the deployment's, an organisation secret (by name), or none."""

    kind: Literal["deployment", "secret", "anonymous"]
    secret: str | None = None


def choose_access(*, own_secret: str, default_secret: str, trusted: bool, secret_names: Collection[str],
                  explicit_secret: str | None, write: bool, needed: str) -> Access:
    """The one order for every outside store (S3 buckets, Hub namespaces): the secret
    the spec names; else the organisation's secret for this very bucket or namespace (`own_secret`); else the
    deployment's credentials, when the operator trusts it; else the organisation's default secret; else none,
    which is enough to read public data and never enough to write (CredentialsNeeded with `needed`)."""
    if explicit_secret:
        return Access("secret", explicit_secret)
    if _SECRET_NAME_RE.match(own_secret) and own_secret in secret_names:
        return Access("secret", own_secret)
    if trusted:
        return Access("deployment")
    if default_secret in secret_names:
        return Access("secret", default_secret)
    if write:
        raise CredentialsNeeded(needed)
    return Access("anonymous")


def choose_s3_access(bucket: str, settings: Settings, secret_names: Collection[str], *,
                     explicit_secret: str | None = None, write: bool = False) -> Access:
    """Whose credentials reach `bucket` (not the deployment's storage: `check_storage_uri` first)."""
    return choose_access(
        own_secret=f"s3.{bucket}", default_secret=DEFAULT_S3_SECRET, secret_names=secret_names,
        trusted=bucket in settings.s3_trusted_buckets or "*" in settings.s3_trusted_buckets,
        explicit_secret=explicit_secret, write=write,
        needed=f"publishing to s3://{bucket} needs your own credentials: store them with PUT /v1/secrets/NAME "
        '({"access_key_id", "secret_access_key", "endpoint_url"?, "region"?}) and name the secret in '
        f"credentials_secret (or call it s3.{bucket} or s3); this deployment lends its own only to "
        "DRAFTSMITH_S3_TRUSTED_BUCKETS")


# --- the Hugging Face Hub ---------------------------------------------------------------------------------------


def hub_namespace(repo: str) -> str:
    """The namespace (user or organisation) of a repo id `namespace/name`, lowercase as the Hub compares them; ''
    for a namespace-less id (`gpt2`), which only `*` trusts."""
    namespace, slash, _ = repo.partition("/")
    return namespace.lower() if slash else ""


def choose_hub_access(repo: str, settings: Settings, secret_names: Collection[str], *,
                      explicit_secret: str | None = None, write: bool = False) -> Access:
    """Whose token a request for `repo` (`namespace/name`, no revision) carries; CredentialsNeeded for a publish
    with none. A trusted namespace counts as untrusted while the deployment has no token to lend it."""
    namespace = hub_namespace(repo)
    trusted = {name.lower() for name in settings.hf_trusted_namespaces}
    listed = "*" in trusted or (namespace != "" and namespace in trusted)
    needed = (f"publishing to the Hub repo {repo} needs a token with write access to it: name your organisation's "
              f"secret in token_secret, or {HUB_SECRETS_HINT}; this deployment lends its own token only to "
              "DRAFTSMITH_HF_TRUSTED_NAMESPACES" + (" (and has none: DRAFTSMITH_HF_TOKEN is not set)"
                                                    if listed and settings.hf_token is None else ""))
    return choose_access(own_secret=f"{DEFAULT_HUB_SECRET}.{namespace}" if namespace else "",
                         default_secret=DEFAULT_HUB_SECRET, secret_names=secret_names,
                         trusted=listed and settings.hf_token is not None, explicit_secret=explicit_secret,
                         write=write, needed=needed)


# --- at admission: every URI of a spec --------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecUri:
    field: str
    uri: str
    write: bool = False
    credentials_secret: str | None = None
    secret_field: str | None = None
    """Where a publish destination names its secret: the field a CredentialsNeeded refusal is reported on."""


def spec_storage_uris(spec: object) -> list[SpecUri]:
    """The URI-bearing fields of a job spec (target, data source, warm start, publish destinations) or an audit
    spec (drafter, target, data source), with the names a problem reports them by."""
    found = [SpecUri("target.uri", spec.target.uri)]  # type: ignore[attr-defined]
    base = getattr(spec.target, "base", None)  # type: ignore[attr-defined]
    if base is not None:  # an adapter target's base model: fetched with the same scope as the target
        found.append(SpecUri("target.base", base))
    data = getattr(spec, "data", None)
    if data is not None:
        found.append(SpecUri("data.source", data.source))
    drafter = getattr(spec, "drafter", None)
    if isinstance(drafter, str):  # an audit's drafter reference
        found.append(SpecUri("drafter", drafter))
    init = getattr(spec, "init", None)
    if init is not None:
        found.append(SpecUri("init.from_drafter", init.from_drafter))
    for index, destination in enumerate(getattr(spec, "publish", None) or []):
        if destination.kind == "s3":
            found.append(SpecUri(f"publish.{index}.uri", destination.uri, write=True,
                                 credentials_secret=destination.credentials_secret,
                                 secret_field=f"publish.{index}.credentials_secret"))
        else:  # a Hub repo, spelled as the hf:// URI its fetches would use
            found.append(SpecUri(f"publish.{index}.repo", f"hf://{destination.repo}", write=True,
                                 credentials_secret=destination.token_secret,
                                 secret_field=f"publish.{index}.token_secret"))
    return found


def tenant_for(session: object, org_id: str) -> Tenant:
    """The tenant, answering from the database through `session` (a SQLAlchemy session)."""
    from sqlalchemy import select

    from domain.models import Job, OrgSecret

    def owns_job(job_id: str) -> bool:
        return session.scalar(select(Job.id).where(Job.id == job_id, Job.org_id == org_id)) is not None  # type: ignore[attr-defined]

    def secret_names() -> set[str]:
        return set(session.scalars(select(OrgSecret.name).where(OrgSecret.org_id == org_id)))  # type: ignore[attr-defined]

    return Tenant(org_id, owns_job, secret_names)


def check_spec_storage(session: object, settings: Settings, org_id: str, spec: object) -> None:
    """Refuse (422 naming each field) a spec with a URI its organisation may not use, or a publish destination
    (a bucket, a Hub repo) it has no usable credentials for. Reads need none: without a secret they go anonymous."""
    from domain.errors import FieldError, InvalidRequest

    tenant = tenant_for(session, org_id)
    errors = []
    for item in spec_storage_uris(spec):
        try:
            inside = check_storage_uri(item.uri, settings, tenant, write=item.write)
            if item.write and inside is None and item.uri.startswith("hf://"):
                choose_hub_access(item.uri.removeprefix("hf://"), settings, tenant.secret_names(),
                                  explicit_secret=item.credentials_secret, write=True)
            elif item.write and inside is None:
                bucket = item.uri.removeprefix("s3://").partition("/")[0]
                choose_s3_access(bucket, settings, tenant.secret_names(), explicit_secret=item.credentials_secret,
                                 write=True)
        except StorageScopeError as exc:
            field = item.secret_field if isinstance(exc, CredentialsNeeded) and item.secret_field else item.field
            errors.append(FieldError(field=field, message=str(exc)))
    if errors:
        raise InvalidRequest(f"{errors[0].field}: {errors[0].message}", errors=errors)


def refuse_link_loops(uri: str) -> None:
    """A file:// path that cannot be resolved because its symbolic links go round in a loop, or a directory with a
    link back to itself or above (a walk through it never ends), is refused. A path this machine does not have
    passes: the worker judges its own disk."""
    import errno

    path = _local_path(uri)
    try:
        real = os.path.realpath(path, strict=True)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageScopeError(f"{uri}: its symbolic links form a loop; give a path that resolves") from None
        return
    if os.path.isdir(real):
        try:
            entries = list(os.scandir(real))
        except OSError:
            return
        for entry in entries[:10_000]:
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if real == target or real.startswith(target.rstrip("/") + "/"):
                    raise StorageScopeError(f"{uri}: {entry.name} links back to the directory or above it (a loop); "
                                            "remove the link")
