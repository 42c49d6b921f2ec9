"""Download pretraining shards (parquet with a `text` column) from the Hugging Face Hub or ModelScope.

`hf_hub_download(..., local_dir=dest)` does the hard parts: when a connection drops mid-file it
resumes with an HTTP Range request, it checks the size it got, it skips a file whose local copy
matches the Hub's etag, and it keeps its bookkeeping under `dest/.cache/` (which `open_source`
ignores). On top of that every shard is opened as parquet and checked for a `text`
column; a corrupt one is deleted and fetched once more. Without a network (HF_HUB_OFFLINE=1, or the
Hub unreachable) the shards already in `dest` are used when there are enough of them.

`repo_id` may name its hub (`modelscope:OWNER/NAME`, `hf:OWNER/NAME`; bare ids follow PORTACHAT_HUB, see
portachat.storage.hubs); ModelScope's own client then lists and fetches the files (it resumes and checks
sha256 itself), and the same parquet check follows.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from portachat.data.document_source import DataError
from portachat.data.sources import read_parquet_metadata
from portachat.i18n import _
from portachat.storage import hubs
from portachat.storage.paths import portachat_home

FINEWEB_EDU_REPO = "karpathy/fineweb-edu-100b-shuffle"  # nanochat's pretraining shards (shard_NNNNN.parquet)
PROBE_TIMEOUT_S = 10.0
_CONNECTION_ERROR_NAMES = {"ConnectError", "ConnectTimeout", "ConnectionError", "Timeout", "ReadTimeout",
                           "TimeoutException", "NetworkError", "TransportError", "ProxyError"}


def _is_offline_env() -> bool:
    return hubs.is_offline()


def _is_connection_error(e: BaseException) -> bool:
    if isinstance(e, HfHubHTTPError) and getattr(e, "response", None) is not None:
        return False  # the Hub answered: a real error (missing repo, no access), not a network problem
    if isinstance(e, (ConnectionError, TimeoutError, LocalEntryNotFoundError)):
        return True
    return any(cls.__name__ in _CONNECTION_ERROR_NAMES for cls in type(e).__mro__)


def local_shards(dest: Path, pattern: str = "*.parquet") -> list[Path]:
    """Files under `dest` whose repo-relative path matches `pattern`, sorted (hidden folders skipped)."""
    if not dest.is_dir():
        return []
    found = []
    for p in dest.rglob("*"):
        rel = p.relative_to(dest)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts) and (
            fnmatch.fnmatch(rel.as_posix(), pattern) or fnmatch.fnmatch(p.name, pattern)
        ):
            found.append(p)
    return sorted(found)


def _use_local(ref: hubs.RepoRef, dest: Path, num_shards: int | None, include_last: bool, pattern: str,
               reason: str, repo_type: str, log: Callable[[str], None]) -> list[Path]:
    have = local_shards(dest, pattern)
    wanted = num_shards + int(include_last) if num_shards is not None else 1
    if len(have) >= wanted and have:
        chosen = have if num_shards is None else have[:num_shards] + (have[-1:] if include_last else [])
        log(_("offline ({reason}): using {n} shard(s) already in {dest}").format(
            reason=reason, n=len(chosen), dest=dest))
        return chosen
    kind = "datasets/" if repo_type == "dataset" else ""
    site = (hubs.MODELSCOPE_DEFAULT_ENDPOINT if ref.hub == hubs.MODELSCOPE else hubs.HF_DEFAULT_ENDPOINT) + "/"
    need = _("{n} shard(s)").format(n=wanted) if num_shards is not None else _("at least one shard")
    raise DataError(
        _("offline ({reason}) and {dest} has {have} file(s) matching {pattern}, {need} needed. "
          "Download them from {url} on a machine with a network and place "
          "them in {dest}, or pass a local data directory, or use the synthetic curriculum").format(
            reason=reason, dest=dest, have=len(have), pattern=repr(pattern), need=need,
            url=f"{site}{kind}{ref.repo_id}")
    )


def _verify(path: Path) -> str | None:
    """None when `path` is a parquet file with a `text` column, else the reason it is not."""
    try:
        read_parquet_metadata(path)
    except DataError as e:
        return str(e)
    return None


def download_shards(
    repo_id: str,
    dest: Path,
    num_shards: int | None = None,
    pattern: str = "*.parquet",
    revision: str = "main",
    repo_type: str = "dataset",
    include_last: bool = False,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Fetch the first `num_shards` files of `repo_id` matching `pattern` (sorted; all when None) into
    `dest` and return their local paths. With two or more shards `open_source(dest)` uses the last
    one as the val split, as nanochat does; `include_last` also fetches the repo's last shard, so the
    val split stays the same whatever `num_shards` is."""
    dest = Path(dest).expanduser()
    if num_shards is not None and num_shards < 1:
        raise ValueError(f"num_shards must be >= 1 or None, got {num_shards}")
    try:
        ref = hubs.parse_repo(repo_id)
    except hubs.HubError as e:
        raise DataError(str(e)) from None
    repo_id = ref.repo_id
    if _is_offline_env():
        return _use_local(ref, dest, num_shards, include_last, pattern, _("HF_HUB_OFFLINE is set"),
                          repo_type, log)
    endpoint = hubs.hf_endpoint()  # read now, so it can change after import
    try:
        if ref.hub == hubs.MODELSCOPE:
            remote = hubs.list_files(ref, repo_type=repo_type, revision=None if revision == "main" else revision)
        else:
            api = HfApi(endpoint=endpoint)
            # one quick request first: listing retries with backoff for a minute when there is no network
            api.repo_info(repo_id, repo_type=repo_type, revision=revision, timeout=PROBE_TIMEOUT_S)
            remote = api.list_repo_files(repo_id, repo_type=repo_type, revision=revision)
    except hubs.HubError as e:
        raise DataError(str(e)) from None
    except Exception as e:
        if _is_connection_error(e):
            return _use_local(ref, dest, num_shards, include_last, pattern,
                              _("cannot reach the Hub: {error_type}").format(error_type=type(e).__name__),
                              repo_type, log)
        shown = repo_id if ref.hub == hubs.HF else str(ref)
        raise DataError(_("cannot list files of {repo_type} {repo}@{revision}: {error}").format(
            repo_type=repo_type, repo=shown, revision=revision, error=e)) from e
    names = sorted(f for f in remote if fnmatch.fnmatch(f, pattern))
    if not names:
        raise DataError(_("{repo_type} {repo}@{revision} has no files matching {pattern} "
                          "({total} files in all); check the repo id and pattern").format(
            repo_type=repo_type, repo=repo_id, revision=revision, pattern=repr(pattern), total=len(remote)))
    if num_shards is not None:
        if num_shards > len(names):
            raise DataError(_("{repo} has {n} files matching {pattern}, fewer than the "
                              "{wanted} asked for").format(
                repo=repo_id, n=len(names), pattern=repr(pattern), wanted=num_shards))
        names = names[:num_shards] + ([names[-1]] if include_last and num_shards < len(names) else [])
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, name in enumerate(names, start=1):
        if ref.hub == hubs.MODELSCOPE:
            path = _modelscope_verified(ref, name, dest, revision, repo_type)
        else:
            path = _download_verified(repo_id, name, dest, revision, repo_type, endpoint)
        log(_("shard {i}/{n}: {name} ({mb} MB) ok").format(
            i=i, n=len(names), name=name, mb=f"{path.stat().st_size / 1e6:.1f}"))
        paths.append(path)
    return paths


def _download_verified(repo_id: str, name: str, dest: Path, revision: str, repo_type: str,
                       endpoint: str | None) -> Path:
    problem = None
    for _attempt in range(2):  # a corrupt copy is deleted and fetched once more
        try:
            path = Path(hf_hub_download(repo_id, name, repo_type=repo_type, revision=revision,
                                        local_dir=dest, endpoint=endpoint))
        except Exception as e:
            if _is_connection_error(e):
                raise DataError(_("lost the connection to the Hub while downloading {name} of {repo} ({error}); "
                                  "run again to resume the download").format(name=name, repo=repo_id, error=e)) from e
            raise DataError(_("cannot download {name} of {repo_type} {repo}@{revision}: {error}").format(
                name=name, repo_type=repo_type, repo=repo_id, revision=revision, error=e)) from e
        problem = _verify(path)
        if problem is None:
            return path
        path.unlink(missing_ok=True)
    raise DataError(_("{name} of {repo} is not a valid shard even after downloading it again "
                      "(deleted it): {problem}").format(name=name, repo=repo_id, problem=problem))


def _modelscope_verified(ref: hubs.RepoRef, name: str, dest: Path, revision: str, repo_type: str) -> Path:
    problem = None
    for _attempt in range(2):  # as for the Hugging Face Hub: a corrupt copy is fetched once more
        try:
            hubs.snapshot(ref, dest, repo_type=repo_type, allow_patterns=[name],
                          revision=None if revision == "main" else revision)
        except hubs.HubError as e:
            raise DataError(str(e)) from None
        except Exception as e:
            raise DataError(_("cannot download {name} of {repo_type} {repo}: {error_type}: {error}").format(
                name=name, repo_type=repo_type, repo=ref, error_type=type(e).__name__, error=e)) from e
        path = dest / name
        problem = _verify(path) if path.is_file() else _("{path} did not arrive").format(path=path)
        if problem is None:
            return path
        path.unlink(missing_ok=True)
    raise DataError(_("{name} of {repo} is not a valid shard even after downloading it again "
                      "(deleted it): {problem}").format(name=name, repo=ref, problem=problem))


def pretraining_data_dir(spec: str, log: Callable[[str], None] = print) -> Path:
    """`--data hf:OWNER/NAME[:GLOB]` (or `modelscope:` / `ms:`) of `train base`: a local directory holding
    the dataset's matching shards (default `*.parquet`), under $PORTACHAT_HOME/base_data. Downloaded once:
    a directory that already holds matching shards is used as it is (every rank of a launched run, and
    later runs, read the copy the first call made)."""

    hub_name, _sep, rest = spec.partition(":")
    repo, _sep, pattern = rest.partition(":")
    if repo.count("/") != 1:
        raise DataError(_("--data {spec}: expected {hub}:OWNER/NAME or {hub}:OWNER/NAME:GLOB, e.g. {example}").format(
            spec=spec, hub=hub_name, example="hf:HuggingFaceFW/fineweb-edu:sample/10BT/*.parquet"))
    pattern = pattern or "*.parquet"
    dest = portachat_home() / "base_data" / f"{hub_name}__{repo.replace('/', '__')}"
    if dest.is_dir() and any(fnmatch.fnmatch(p.relative_to(dest).as_posix(), pattern) for p in dest.rglob("*")
                             if p.is_file()):
        return dest
    download_shards(f"{hub_name}:{repo}", dest, pattern=pattern, log=log)
    return dest
