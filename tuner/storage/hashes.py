"""Full file hashes kept per host in `tuner_file_hashes`, so a model is read in full once."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from tuner.storage.orm import FileHash, get_or_create, utcnow
from tuner.storage.store import Store


class StoredHashes:
    """Full file hashes kept in tuner_file_hashes for one host: a fingerprint.FileHashCache."""

    def __init__(self, store: Store, host: str) -> None:
        self.store = store
        self.host = host

    def get(self, path: Path, size: int, mtime_ns: int, content_id: str) -> str | None:
        query = select(FileHash).filter_by(host=self.host, path=str(path))
        with self.store.session() as session:
            row = session.scalars(query).first()
        if row is None or (row.size, row.mtime_ns, row.content_id) != (size, mtime_ns, content_id):
            return None
        return row.sha256

    def put(self, path: Path, size: int, mtime_ns: int, content_id: str, sha256: str) -> None:
        facts = {"size": size, "mtime_ns": mtime_ns, "content_id": content_id, "sha256": sha256}
        with self.store.session() as session:
            row = get_or_create(session, FileHash, {"host": self.host, "path": str(path)}, facts)
            # get_or_create only fills empty columns; an existing row is stale: overwrite it.
            for key, value in {**facts, "hashed_at": utcnow()}.items():
                setattr(row, key, value)
