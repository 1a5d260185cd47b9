"""Whose token a Hugging Face Hub request carries (issue 20): the S3 rule of api/storage_scope.py, for the Hub.

The deployment's `hf_token` may read private repos, or write to namespaces, that only the deployment (or another
customer who lent it access) should reach. Sent on every organisation's `hf://` fetch, it would make the service a
confused deputy: organisation B trains on a private model it could never read itself, or overwrites a repo it
could never write. So a Hub request carries, in this order (`choose_access`, the same order as for buckets):

1. the secret a publish destination names (`token_secret`);
2. the organisation's secret `hf.<namespace>` (the repo's namespace, lowercase: `hf://Acme/llama` -> `hf.acme`);
3. the deployment's token, only when the operator lists the namespace in `hf_trusted_namespaces`
   (`DRAFTSMITH_HF_TRUSTED_NAMESPACES`; `*` for all, the default in development only, whose one organisation is
   the operator);
4. the organisation's secret `hf` (its default Hub token);
5. no token at all: enough for public repos, never for a publish (CredentialsNeeded: a 422 on
   `publish.N.token_secret` when the spec is accepted, `storage_not_allowed` in the worker).

A Hub secret's value is the token itself (`hf_...`). "No token" means no Authorization header: the worker passes
`token=False`, so `huggingface_hub` does not fall back to a token of the machine's (HF_TOKEN, a cached login).
The API judges publish destinations when a spec is accepted (api/storage_scope.check_spec_storage); it cannot tell
whether a repo it would read is private, so reads are judged, and their token chosen, by the worker before every
fetch (worker/sources.hub_token), as are publishes again.
"""

from __future__ import annotations

from collections.abc import Collection

from api.settings import Settings
from api.storage_scope import Access, CredentialsNeeded, choose_access

DEFAULT_HUB_SECRET = "hf"
HUB_SECRETS_HINT = ("store your own Hub token as the secret hf.<namespace> or hf (PUT /v1/secrets/NAME; the value is "
                    "the token)")


def hub_namespace(repo: str) -> str:
    """The namespace (user or organisation) of a repo id `namespace/name`, lowercase as the Hub compares them; ''
    for a namespace-less id (`gpt2`), which only `*` trusts."""
    namespace, slash, _ = repo.partition("/")
    return namespace.lower() if slash else ""


def hub_secret_name(repo: str) -> str:
    """The organisation secret for the repo's namespace, `hf.<namespace>`; '' for a namespace-less id."""
    namespace = hub_namespace(repo)
    return f"{DEFAULT_HUB_SECRET}.{namespace}" if namespace else ""


def namespace_trusted(repo: str, settings: Settings) -> bool:
    trusted = {name.lower() for name in settings.hf_trusted_namespaces}
    return "*" in trusted or (hub_namespace(repo) != "" and hub_namespace(repo) in trusted)


def choose_hub_access(repo: str, settings: Settings, secret_names: Collection[str], *,
                      explicit_secret: str | None = None, write: bool = False) -> Access:
    """Whose token a request for `repo` (`namespace/name`, no revision) carries; CredentialsNeeded for a publish
    with none. A trusted namespace without a deployment token reads anonymously and cannot be published to."""
    needed = (f"publishing to the Hub repo {repo} needs a token with write access to it: name your organisation's "
              f"secret in token_secret, or {HUB_SECRETS_HINT}; this deployment lends its own token only to "
              "DRAFTSMITH_HF_TRUSTED_NAMESPACES")
    access = choose_access(own_secret=hub_secret_name(repo), default_secret=DEFAULT_HUB_SECRET,
                           trusted=namespace_trusted(repo, settings), secret_names=secret_names,
                           explicit_secret=explicit_secret, write=write, needed=needed)
    if access.kind == "deployment" and settings.hf_token is None:
        if write:
            raise CredentialsNeeded(f"{needed} (and none is configured: DRAFTSMITH_HF_TOKEN)")
        return Access("anonymous")
    return access
