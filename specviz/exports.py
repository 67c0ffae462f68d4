"""Saved runs on a server: unguessable names, one folder per session, bounded in count and age,
and a replay that reads only what a visitor uploaded in the same session.

A public page must not let one visitor read another's runs or any file of the server: exports get
random names in a private per-process folder (mode 0700) outside the web server's upload folder;
replay accepts a file only from inside the upload folder (what a browser or API client uploaded:
its names there are keyed hashes nobody can guess), never from the export folder or anywhere
else, and says nothing about paths it refuses (no existence leak).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path

from .trace import MAX_FILE_BYTES, Trace, load_runs, save_runs

MAX_PER_SESSION = 5  # newest exports kept per session
MAX_SESSIONS = 200  # session folders kept (oldest removed first)
MAX_AGE_S = 3600.0  # exports older than this are removed


class Exports:
    def __init__(self, root: str | os.PathLike | None = None):
        base = Path(root) if root else Path(tempfile.gettempdir())
        self.root = base / f"specviz-exports-{secrets.token_hex(8)}"
        self._lock = threading.Lock()

    def _session_dir(self, session: str) -> Path:
        key = hashlib.sha256(f"{self.root}:{session}".encode()).hexdigest()[:24]
        return self.root / key

    def save(self, session: str, spec: Trace, vanilla: Trace | None, meta: dict | None = None) -> str:
        """A run's events (the saved-run format), for download."""
        meta = {"saved": time.strftime("%Y-%m-%d %H:%M:%S"), **(meta or {})}
        return self._write(session, "specviz-run", lambda path: save_runs(path, spec, vanilla, meta))

    def save_json(self, session: str, stem: str, data: dict) -> str:
        """Any other result (a Lab experiment's), under the same bounds."""
        def write(path):
            with open(path, "w") as f:
                json.dump(data, f)
        return self._write(session, stem, write)

    def _write(self, session: str, stem: str, write) -> str:
        with self._lock:
            folder = self._session_dir(session)
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = folder / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_urlsafe(12)}.json"
            write(path)
            self._prune(folder)
            return str(path)

    def _prune(self, current: Path) -> None:
        now = time.time()
        files = sorted(current.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[MAX_PER_SESSION:]:
            old.unlink(missing_ok=True)
        folders = sorted((d for d in self.root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime,
                         reverse=True)
        for i, d in enumerate(folders):
            if d != current and (i >= MAX_SESSIONS or now - d.stat().st_mtime > MAX_AGE_S):
                shutil.rmtree(d, ignore_errors=True)
        for f in self.root.glob("*/*.json"):
            if now - f.stat().st_mtime > MAX_AGE_S:
                f.unlink(missing_ok=True)

    def count(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.exists() else 0

    def load_upload(self, path, upload_folder: str | os.PathLike) -> tuple[Trace, Trace | None, dict]:
        """Read a run the visitor uploaded; ValueError (one clear sentence) for anything else."""
        refused = ValueError("that is not a file uploaded in this session: upload a specviz run (.json)")
        try:
            real = Path(os.path.realpath(str(path)))
            folder = Path(os.path.realpath(str(upload_folder)))
        except (TypeError, ValueError, OSError):
            raise refused from None
        if folder not in real.parents or self.root in real.parents or not real.is_file():
            raise refused
        if real.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"the file is larger than {MAX_FILE_BYTES // 2**20} MB; not a specviz run")
        return load_runs(real)

