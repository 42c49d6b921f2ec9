"""Which hub a download comes from, and fetching files through that hub's own client library.

Every download in portachat (pretraining shards, chat and evaluation data, models for `--init` and
`serve`) goes through here, so they all follow the same settings, read when the download starts
(huggingface_hub reads its own copies once, at import):

  hf:OWNER/NAME          the Hugging Face Hub (huggingface_hub), at HF_ENDPOINT when set
                         (a mirror, e.g. `export HF_ENDPOINT=https://hf-mirror.com`)
  modelscope:OWNER/NAME  ModelScope (its `modelscope` client: `pip install 'portachat[china]'`),
                         at MODELSCOPE_ENDPOINT (or MODELSCOPE_DOMAIN) when set
  OWNER/NAME             the hub PORTACHAT_HUB names (hf by default, or modelscope)
  HF_HUB_OFFLINE=1       no network for any hub: only what is already local is used
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HF, MODELSCOPE = "hf", "modelscope"
PREFIXES = {"hf:": HF, "modelscope:": MODELSCOPE, "ms:": MODELSCOPE}
HUB_ENV = "PORTACHAT_HUB"
HF_DEFAULT_ENDPOINT = "https://huggingface.co"
HF_MIRROR = "https://hf-mirror.com"
MODELSCOPE_DEFAULT_ENDPOINT = "https://www.modelscope.cn"
MODELSCOPE_INSTALL = "pip install 'portachat[china]'  (or: pip install modelscope)"
PROBE_TIMEOUT_S = 3.0
_TRUE = ("1", "ON", "YES", "TRUE")

# User-facing messages, kept together so they can be translated.
MSG_BAD_HUB = "{env}={value!r} is not a hub portachat knows; use hf or modelscope"
MSG_NO_MODELSCOPE = "ModelScope downloads need ModelScope's client library, which is not installed: {install}"
MSG_OFFLINE = "HF_HUB_OFFLINE is set: not downloading {repo} from {hub}; unset it, or use files already here"
ADVICE_MIRROR = "the Hugging Face Hub is not reachable but its mirror is: export HF_ENDPOINT=" + HF_MIRROR
ADVICE_MODELSCOPE = ("ModelScope is reachable: export PORTACHAT_HUB=modelscope (or name repos modelscope:OWNER/NAME), "
                     "and install its client: " + MODELSCOPE_INSTALL)
ADVICE_NONE = ("no model hub is reachable from this machine: behind a proxy, export HTTPS_PROXY=http://HOST:PORT; "
               "without a network, export HF_HUB_OFFLINE=1 and pass local files (--data DIR, --model DIR)")
ADVICE_SET_ENDPOINT_UNREACHABLE = "HF_ENDPOINT={endpoint} is not reachable; check it, or unset it"


class HubError(RuntimeError):
    """A download that cannot happen (no client library, offline, unknown hub); the message says what to do."""


@dataclass(frozen=True)
class RepoRef:
    hub: str  # HF or MODELSCOPE
    repo_id: str  # OWNER/NAME

    def __str__(self) -> str:
        return f"{self.hub}:{self.repo_id}"


def default_hub() -> str:
    value = os.environ.get(HUB_ENV, "").strip().lower()
    if value in ("", "hf", "huggingface", "hugging-face"):
        return HF
    if value in ("modelscope", "ms"):
        return MODELSCOPE
    raise HubError(MSG_BAD_HUB.format(env=HUB_ENV, value=value))


def has_hub_prefix(spec: str) -> bool:
    return any(str(spec).startswith(p) for p in PREFIXES)


def parse_repo(spec: str) -> RepoRef:
    """`hf:a/b`, `modelscope:a/b` (or `ms:a/b`), or a bare `a/b` on the default hub."""
    spec = str(spec)
    for prefix, hub in PREFIXES.items():
        if spec.startswith(prefix):
            return RepoRef(hub, spec[len(prefix):])
    return RepoRef(default_hub(), spec)


def is_offline() -> bool:
    from huggingface_hub import constants  # deferred: slow import, downloads only

    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def hf_endpoint() -> str | None:
    """HF_ENDPOINT as set now (None: huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None


def modelscope_endpoint() -> str | None:
    """MODELSCOPE_ENDPOINT (or the older MODELSCOPE_DOMAIN) as set now, with a scheme (None: the client's
    default, www.modelscope.cn)."""
    value = (os.environ.get("MODELSCOPE_ENDPOINT") or os.environ.get("MODELSCOPE_DOMAIN") or "").strip().rstrip("/")
    if value and not value.startswith(("http://", "https://")):
        value = "https://" + value
    return value or None


def _modelscope_snapshot_download() -> Any:
    try:
        from modelscope.hub.snapshot_download import snapshot_download  # deferred: portachat[china]
    except ImportError:
        raise HubError(MSG_NO_MODELSCOPE.format(install=MODELSCOPE_INSTALL)) from None
    return snapshot_download


def snapshot(ref: RepoRef, local_dir: Path | None = None, repo_type: str = "model",
             allow_patterns: list[str] | None = None, revision: str | None = None,
             local_files_only: bool | None = None) -> Path:
    """Download the repo's files matching `allow_patterns` (all when None) into `local_dir` (the hub's
    own cache when None) and return the directory. Offline (or `local_files_only`), only a copy
    already in the hub's cache is returned; into a `local_dir` nothing can come, so that is an error."""
    local_only = is_offline() if local_files_only is None else local_files_only
    if local_only and local_dir is not None:
        raise HubError(MSG_OFFLINE.format(repo=ref.repo_id, hub=ref.hub))
    if ref.hub == MODELSCOPE:
        path = _modelscope_snapshot_download()(
            repo_id=ref.repo_id, repo_type=repo_type, revision=revision, allow_patterns=allow_patterns,
            local_dir=str(local_dir) if local_dir is not None else None, endpoint=modelscope_endpoint(),
            local_files_only=local_only)
        return Path(path)
    from huggingface_hub import snapshot_download  # deferred: slow import, downloads only

    path = snapshot_download(repo_id=ref.repo_id, repo_type=repo_type, revision=revision,
                             allow_patterns=allow_patterns, local_dir=local_dir, endpoint=hf_endpoint(),
                             local_files_only=local_only)
    return Path(path)


def list_files(ref: RepoRef, repo_type: str = "dataset", revision: str | None = None) -> list[str]:
    """Paths of every file in the repo (ModelScope's client pages through big dataset listings itself)."""
    if ref.hub == MODELSCOPE:
        _modelscope_snapshot_download()  # the clear error when the client is missing
        # the client stack `modelscope` >= 1.38 installs and wraps
        from modelscope_hub.api import HubApi  # deferred: optional (portachat[china])

        entries = HubApi(endpoint=modelscope_endpoint()).list_repo_files(ref.repo_id, repo_type, revision=revision)
        return sorted(e.path for e in entries if e.type != "tree")
    from huggingface_hub import HfApi  # deferred: slow import, downloads only

    return HfApi(endpoint=hf_endpoint()).list_repo_files(ref.repo_id, repo_type=repo_type, revision=revision)


# ----------------------------------------------------------------------------- reachability (doctor)


@dataclass(frozen=True)
class HubProbe:
    name: str  # "huggingface", "hf-mirror", "modelscope"
    url: str
    reachable: bool
    detail: str  # "HTTP 200 in 0.12 s" or why not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_url(name: str, url: str, timeout: float = PROBE_TIMEOUT_S) -> HubProbe:
    """A HEAD request: any HTTP answer (even 404) means the host is reachable from here."""
    start = time.perf_counter()
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "portachat-doctor"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return HubProbe(name, url, False, f"{type(reason).__name__}: {reason}")
    return HubProbe(name, url, True, f"HTTP {status} in {time.perf_counter() - start:.2f} s")


def probe_hubs(timeout: float = PROBE_TIMEOUT_S, hf_default: str = HF_DEFAULT_ENDPOINT,
               mirror: str = HF_MIRROR) -> list[HubProbe]:
    """Hugging Face (HF_ENDPOINT when set), ModelScope (MODELSCOPE_ENDPOINT when set) and, when HF_ENDPOINT
    is not set, the hf-mirror.com mirror; probed in parallel, so this takes at most `timeout`."""
    targets = [("huggingface", hf_endpoint() or hf_default),
               ("modelscope", modelscope_endpoint() or MODELSCOPE_DEFAULT_ENDPOINT)]
    if hf_endpoint() is None:
        targets.append(("hf-mirror", mirror))
    with ThreadPoolExecutor(len(targets)) as pool:
        return list(pool.map(lambda t: probe_url(t[0], t[1], timeout), targets))


def hub_advice(probes: list[HubProbe]) -> list[str]:
    """What to set, given which hubs answered; empty when the Hugging Face Hub (or HF_ENDPOINT) did."""
    ok = {p.name: p.reachable for p in probes}
    if ok.get("huggingface"):
        return []
    advice = []
    if hf_endpoint() is not None:
        advice.append(ADVICE_SET_ENDPOINT_UNREACHABLE.format(endpoint=hf_endpoint()))
    if ok.get("hf-mirror"):
        advice.append(ADVICE_MIRROR)
    if ok.get("modelscope"):
        advice.append(ADVICE_MODELSCOPE)
    if not any(ok.values()):
        advice.append(ADVICE_NONE)
    return advice
