"""Package indexes asked with the standard library only (the lock's checks run on a bare python3, before .venv):
the files an index holds for one name and version, each with its sha256 and Requires-Python, cached on disk.

- `JsonIndex(base)`: the PyPI JSON API, `<base>/pypi/<name>/<version>/json` (PyPI, and the mirrors that serve it:
  devpi, Nexus, Artifactory). An index whose per-version endpoint answers 404 for a release its project page
  `<base>/pypi/<name>/json` lists (some mirrors and proxies serve only that one) is asked for project pages from
  then on;
- `SimpleIndex(url)`: a PEP 503 HTML page `<url>/<name>/` (the torch CPU wheel index: it has no JSON API);
- `Getter`: one GET with a bounded timeout and a bounded number of attempts (429, 5xx and network errors are
  retried with a backoff), trusting the CA bundle of SSL_CERT_FILE / REQUESTS_CA_BUNDLE / PIP_CERT, else
  /etc/ssl/certs/ca-certificates.crt next to the system's store; proxies from HTTPS_PROXY. 404 and 410 are answers
  ("not there"); anything else after the last attempt is IndexUnreachable naming the index and what to set.
  `file://` URLs read a local directory laid out like the index (tests, an offline copy).

Every answer of a remote index, found or not, is kept in `<cache>/<index>/<name>/<version>.json` (one atomic
write), so a re-run asks nothing; delete the directory to ask again.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import Request, url2pathname, urlopen

from .errors import IndexUnreachable, Rollout8Error
from .fileutil import atomic_write
from .yamlio import load_json

PYPI = "https://pypi.org"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT")
SDIST_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2", ".tgz", ".tar.xz", ".tar")
CACHE_SCHEMA = 1
USER_AGENT = "rollout8-lock-check (python urllib)"


@dataclass(frozen=True)
class IndexFile:
    filename: str
    sha256: str
    requires_python: str | None = None

    @property
    def kind(self) -> str:
        if self.filename.endswith(".whl"):
            return "wheel"
        return "sdist" if self.filename.lower().endswith(SDIST_SUFFIXES) else "other"


class FetchFailed(Exception):
    """A GET that got no answer (the index turns it into IndexUnreachable with its own advice)."""

    def __init__(self, url: str, cause: str, *, untrusted: bool = False) -> None:
        super().__init__(f"{url}: {cause}")
        self.cause = cause
        self.untrusted = untrusted


def ca_bundle(env: Mapping[str, str] = os.environ) -> tuple[str | None, str]:
    """(the CA file to trust, where it was named): the first of CA_VARIABLES set, else the Debian/Ubuntu bundle."""
    for name in CA_VARIABLES:
        if env.get(name):
            return env[name], name
    return (SYSTEM_CA, SYSTEM_CA) if Path(SYSTEM_CA).is_file() else (None, "the system store")


def label(url: str) -> str:
    """The URL as it may be printed: no user or password."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


class Getter:
    """GET url -> its bytes, or None for 404/410. Raises FetchFailed after `attempts` tries (or at once for an
    answer that a retry cannot change: 401, 403, an untrusted certificate)."""

    def __init__(self, *, timeout: float = 20.0, attempts: int = 3, backoff: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timeout, self.attempts, self.backoff, self.sleep = timeout, attempts, backoff, sleep
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        if self._context is None:
            cafile, named = ca_bundle()
            try:
                context = ssl.create_default_context()  # the system's store, which the bundle adds to
                if cafile:
                    context.load_verify_locations(cafile=cafile)
                self._context = context
            except (OSError, ssl.SSLError) as exc:
                raise IndexUnreachable(f"the CA bundle {cafile} ({named}) cannot be loaded ({exc}): point "
                                       "SSL_CERT_FILE at a readable PEM bundle") from None
        return self._context

    def __call__(self, url: str) -> bytes | None:
        parts = urlsplit(url)
        if parts.scheme == "file":
            path = Path(url2pathname(parts.path))
            path = path / "index.html" if path.is_dir() else path  # a simple page: <index>/<name>/
            return path.read_bytes() if path.is_file() else None
        cause = "no attempt"
        for attempt in range(self.attempts):
            if attempt:
                self.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                request = Request(url, headers={"User-Agent": USER_AGENT})
                with urlopen(request, timeout=self.timeout, context=self.context()) as response:
                    return response.read()
            except HTTPError as exc:
                if exc.code in (404, 410):
                    return None
                cause = f"HTTP {exc.code} {exc.reason}"
                if exc.code != 429 and exc.code < 500:
                    raise FetchFailed(url, cause) from None
            except URLError as exc:
                if isinstance(exc.reason, ssl.SSLCertVerificationError):
                    raise FetchFailed(url, f"certificate not trusted ({exc.reason.verify_message})",
                                      untrusted=True) from None
                cause = str(exc.reason)
            except (OSError, http.client.HTTPException) as exc:
                cause = f"{type(exc).__name__}: {exc}"
        raise FetchFailed(url, f"{cause} ({self.attempts} attempts, {self.timeout:g} s timeout each)")


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", part).strip("_") or "_"


class _Index:
    """What both index kinds share: the cache and the one line a failed GET becomes."""

    api = ""
    hint = ""

    def __init__(self, url: str, cache: Path, get: Callable[[str], bytes | None]) -> None:
        self.url = url.rstrip("/")
        self.label = label(self.url)
        parts = urlsplit(self.label)
        self.cache = cache / _safe(parts.netloc + parts.path)
        self.local = parts.scheme == "file"  # a directory on this machine: nothing to cache
        self.get = get

    def cache_path(self, name: str, version: str) -> Path:
        return self.cache / _safe(name) / f"{_safe(version)}.json"

    def files(self, name: str, version: str) -> tuple[list[IndexFile] | None, bool]:
        """(the files of name==version, None if the index has no such release; whether the cache answered)."""
        path = self.cache_path(name, version)
        if self.local:
            return self._asked(name, version), False
        if path.is_file():
            try:
                data = load_json(path.read_bytes(), source=path, error=Rollout8Error)
                if data.get("schema") == CACHE_SCHEMA:
                    return ([IndexFile(**f) for f in data["files"]] if data["found"] else None), True
            except (OSError, ValueError, TypeError, KeyError, AttributeError, Rollout8Error):
                pass  # a damaged entry is asked again and rewritten
        files = self._asked(name, version)
        record = {"schema": CACHE_SCHEMA, "index": self.label, "name": name, "version": version,
                  "found": files is not None, "files": [asdict(f) for f in files or []]}
        atomic_write(path, json.dumps(record, indent=1) + "\n")
        return files, False

    def _asked(self, name: str, version: str) -> list[IndexFile] | None:
        try:
            return self._ask(name, version)
        except FetchFailed as exc:
            raise self.unreachable(exc) from None

    def unreachable(self, exc: FetchFailed) -> IndexUnreachable:
        if exc.untrusted:
            _, named = ca_bundle()
            return IndexUnreachable(f"cannot ask the package index {self.label}: {exc.cause} with the CA bundle of "
                                    f"{named}: set SSL_CERT_FILE to your (corporate) CA bundle")
        return IndexUnreachable(f"cannot ask the package index {self.label}: {exc.cause}: check the network or "
                                f"HTTPS_PROXY, or {self.hint}")

    def _ask(self, name: str, version: str) -> list[IndexFile] | None:
        raise NotImplementedError


class JsonIndex(_Index):
    api = "the PyPI JSON API (<index>/pypi/<name>/<version>/json)"
    hint = ("point ROLLOUT8_INDEX_URL (or PIP_INDEX_URL=<mirror>/simple) at a reachable mirror that serves the PyPI "
            "JSON API")

    def __init__(self, url: str, cache: Path, get: Callable[[str], bytes | None]) -> None:
        super().__init__(url, cache, get)
        self.per_version = True  # False once the index showed it serves project pages only

    def _json(self, url: str) -> dict | None:
        data = self.get(url)
        if data is None:
            return None
        try:
            out = load_json(data, source=label(url), error=IndexUnreachable)
        except ValueError:
            out = None
        if not isinstance(out, dict):
            raise IndexUnreachable(f"{label(url)}: not a JSON API answer: {self.label} does not serve {self.api}; "
                                   f"{self.hint}")
        return out

    def _ask(self, name: str, version: str) -> list[IndexFile] | None:
        asked_release = self.per_version
        if asked_release:
            release = self._json(f"{self.url}/pypi/{name}/{version}/json")
            if release is not None:
                return _records(release.get("urls"))
        project = self._json(f"{self.url}/pypi/{name}/json")
        releases = (project or {}).get("releases") or {}
        key = next((k for k in releases if k == version), None) or \
            next((k for k in releases if k.lower() == version.lower()), None)
        if key is None:
            return None
        if asked_release:
            self.per_version = False
        return _records(releases[key])


def _records(items: object) -> list[IndexFile]:
    out = []
    for item in items if isinstance(items, list) else []:
        sha = ((item.get("digests") or {}).get("sha256") if isinstance(item, dict) else None)
        if isinstance(sha, str) and isinstance(item.get("filename"), str):
            out.append(IndexFile(item["filename"], sha.lower(), item.get("requires_python") or None))
    return out


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "a" and found.get("href"):
            self.links.append((found["href"] or "", found.get("data-requires-python")))


def simple_files(page: str, page_url: str) -> list[IndexFile]:
    """The files a PEP 503 page links to that carry a #sha256= fragment."""
    parser = _Anchors()
    parser.feed(page)
    out = []
    for href, requires in parser.links:
        parts = urlsplit(urljoin(page_url, href))
        match = re.search(r"(?:^|&)sha256=([0-9a-fA-F]{64})(?:&|$)", parts.fragment)
        if match:
            out.append(IndexFile(unquote(parts.path.rsplit("/", 1)[-1]), match.group(1).lower(), requires or None))
    return out


def file_version(filename: str) -> str | None:
    """The version part of a wheel's or an sdist's file name."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return parts[1] if len(parts) in (5, 6) else None
    for suffix in SDIST_SUFFIXES:
        if filename.lower().endswith(suffix):
            return filename[: -len(suffix)].rpartition("-")[2] or None
    return None


class SimpleIndex(_Index):
    api = "PEP 503 simple pages (<index>/<name>/)"
    hint = "point TORCH_INDEX_URL at a reachable mirror of it"

    def _ask(self, name: str, version: str) -> list[IndexFile] | None:
        page_url = f"{self.url}/{name}/"
        page = self.get(page_url)
        if page is None:
            return None
        # `name==2.7.1` takes 2.7.1+cpu too: pip ignores the local label of a candidate when the pin has none
        found = [f for f in simple_files(page.decode("utf-8", "replace"), page_url)
                 if (file_version(f.filename) or "").split("+")[0].lower() == version.lower()]
        return found or None
