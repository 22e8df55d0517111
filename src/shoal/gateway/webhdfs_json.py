"""Hadoop's WebHDFS JSON shapes, as pure functions: FileStatus, listings, content
summaries, block locations (both the HCFS ``BlockLocations`` and the older
``LocatedBlocks`` form), server defaults, the file checksum and RemoteException.

Field names and types follow what Hadoop's ``JsonUtilClient`` parses (it reads numbers
as ``Number``, ``permission`` as an octal string, ``checksumType`` as the ordinal of
``DataChecksum.Type``); a missing field it needs is a NullPointerException in the
client, so every shape here carries all of them.

The checksum (:class:`HdfsChecksum`) is the real HDFS ``MD5-of-MD5-of-CRC32C`` over the
file's bytes with the gateway's block size and 512 bytes per CRC, so it equals what a
NameNode with the same block size reports for the same bytes (``distcp -update``
compares them).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import xxhash

from shoal.errors import InvalidArgument, ShoalError

#: bytes each CRC covers (HDFS's dfs.bytes-per-checksum)
BYTES_PER_CRC = 512
#: DataChecksum.Type.CRC32C.ordinal() (NULL=0, CRC32=1, CRC32C=2)
CHECKSUM_TYPE_CRC32C = 2
OWNER = "shoal"
GROUP = "shoal"


def file_id(path: str) -> int:
    """A stable positive inode number for a path (Hadoop reads it as a Java long)."""
    return xxhash.xxh64_intdigest(path.encode()) & 0x7FFF_FFFF_FFFF_FFFF


def file_status(
    name: str,
    full_path: str,
    *,
    is_dir: bool,
    length: int,
    mtime: float,
    block_size: int,
    writable: bool,
) -> dict[str, Any]:
    """One FileStatus object; ``name`` is the pathSuffix ("" for the path itself)."""
    ms = int(mtime * 1000)
    out: dict[str, Any] = {
        "accessTime": ms,
        "blockSize": 0 if is_dir else block_size,
        "fileId": file_id(full_path),
        "group": GROUP,
        "length": 0 if is_dir else length,
        "modificationTime": ms,
        "owner": OWNER,
        "pathSuffix": name,
        "permission": ("755" if writable else "555") if is_dir else ("644" if writable else "444"),
        "replication": 0 if is_dir else 1,
        "storagePolicy": 0,
        "type": "DIRECTORY" if is_dir else "FILE",
    }
    if not is_dir:
        out["childrenNum"] = 0
    return out


def file_statuses(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    return {"FileStatuses": {"FileStatus": statuses}}


def directory_listing(statuses: list[dict[str, Any]], remaining: int) -> dict[str, Any]:
    """LISTSTATUS_BATCH: one page and how many entries follow it."""
    return {
        "DirectoryListing": {
            "partialListing": {"FileStatuses": {"FileStatus": statuses}},
            "remainingEntries": remaining,
        }
    }


def content_summary(length: int, files: int, directories: int) -> dict[str, Any]:
    return {
        "ContentSummary": {
            "directoryCount": directories,
            "ecPolicy": "",
            "fileCount": files,
            "length": length,
            "quota": -1,
            "spaceConsumed": length,
            "spaceQuota": -1,
            "typeQuota": {},
        }
    }


def server_defaults(block_size: int) -> dict[str, Any]:
    return {
        "FsServerDefaults": {
            "blockSize": block_size,
            "bytesPerChecksum": BYTES_PER_CRC,
            "writePacketSize": 65536,
            "replication": 1,
            "fileBufferSize": 4096,
            "encryptDataTransfer": False,
            "trashInterval": 0,
            "checksumType": CHECKSUM_TYPE_CRC32C,
            "keyProviderUri": "",
            "defaultStoragePolicyId": 7,
        }
    }


def fs_status(capacity: int, used: int) -> dict[str, Any]:
    return {"FsStatus": {"capacity": capacity, "used": used, "remaining": max(0, capacity - used)}}


# -- block locations -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Host:
    """A worker as a block location: Spark compares ``host`` with its executors' hosts."""

    host: str
    port: int


def blocks(size: int, block_size: int, offset: int, length: int) -> list[tuple[int, int]]:
    """(start, length) of every block of a file of ``size`` that overlaps
    [offset, offset+length); length < 0: to the end."""
    end = size if length < 0 else min(size, offset + length)
    out = []
    first = max(0, offset) // block_size
    for i in range(first, (size + block_size - 1) // block_size):
        start = i * block_size
        if start >= end:
            break
        out.append((start, min(block_size, size - start)))
    return out


def block_locations(spans: Iterable[tuple[int, int]], hosts: Sequence[Host]) -> dict[str, Any]:
    """GETFILEBLOCKLOCATIONS (the HCFS form, ``BlockLocations``)."""
    return {
        "BlockLocations": {
            "BlockLocation": [
                {
                    "cachedHosts": [h.host for h in hosts],
                    "corrupt": False,
                    "hosts": [h.host for h in hosts],
                    "length": n,
                    "names": [f"{h.host}:{h.port}" for h in hosts],
                    "offset": start,
                    "storageIds": [f"shoal-{h.host}-{h.port}" for h in hosts],
                    "storageTypes": ["RAM_DISK" for _ in hosts],
                    "topologyPaths": [f"/default-rack/{h.host}:{h.port}" for h in hosts],
                }
                for start, n in spans
            ]
        }
    }


#: an empty Hadoop Token (identifier, password, kind, service: four zero vints) in
#: Token.encodeToUrlString's base64url form; the client only decodes it
_EMPTY_TOKEN = "AAAAAA"


def _datanode(h: Host) -> dict[str, Any]:
    return {
        "adminState": "NORMAL",
        "blockPoolUsed": 0,
        "cacheCapacity": 0,
        "cacheUsed": 0,
        "capacity": 0,
        "dfsUsed": 0,
        "hostName": h.host,
        "infoPort": h.port,
        "infoSecurePort": 0,
        "ipAddr": h.host,
        "ipcPort": h.port,
        "lastUpdate": 0,
        "lastUpdateMonotonic": 0,
        "networkLocation": "/default-rack",
        "remaining": 0,
        "storageID": f"shoal-{h.host}-{h.port}",
        "xceiverCount": 0,
        "xferPort": h.port,
    }


def located_blocks(
    path: str,
    size: int,
    block_size: int,
    spans: Sequence[tuple[int, int]],
    hosts: Sequence[Host],
) -> dict[str, Any]:
    """GET_BLOCK_LOCATIONS (the older ``LocatedBlocks`` form, for clients before 3.x)."""
    base = file_id(path)
    nodes = [_datanode(h) for h in hosts]

    def one(i: int, start: int, n: int) -> dict[str, Any]:
        return {
            "block": {
                "blockId": (base + i) & 0x7FFF_FFFF_FFFF_FFFF,
                "blockPoolId": "shoal",
                "generationStamp": 1,
                "numBytes": n,
            },
            "blockToken": {"urlString": _EMPTY_TOKEN},
            "cachedLocations": nodes,
            "isCorrupt": False,
            "locations": nodes,
            "startOffset": start,
            "storageTypes": ["RAM_DISK" for _ in hosts],
        }

    items = [one(start // block_size, start, n) for start, n in spans]
    return {
        "LocatedBlocks": {
            "fileLength": size,
            "isLastBlockComplete": True,
            "isUnderConstruction": False,
            "lastLocatedBlock": items[-1] if items else None,
            "locatedBlocks": items,
        }
    }


# -- checksum --------------------------------------------------------------------------


class HdfsChecksum:
    """HDFS's file checksum, fed the file's bytes in order: the MD5 of the per-block
    MD5s of the big-endian CRC32C of every 512-byte chunk.

    As the DFSClient reports it, ``crcPerBlock`` is the CRCs per full block when the
    file has more than one block, else 0; an empty file is the MD5 of no block MD5s.
    """

    def __init__(self, block_size: int) -> None:
        if block_size % BYTES_PER_CRC:
            raise ValueError("block size must be a multiple of 512")
        self.block_size = block_size
        self._file = hashlib.md5()
        self._block = hashlib.md5()
        self._in_block = 0
        self._pending = b""
        self._blocks = 0

    def update(self, data: bytes) -> None:
        buf = self._pending + data if self._pending else data
        view = memoryview(buf)
        pos = 0
        while len(view) - pos >= BYTES_PER_CRC:
            room = self.block_size - self._in_block
            take = min(room, (len(view) - pos) // BYTES_PER_CRC * BYTES_PER_CRC)
            self._block.update(_crcs(view[pos : pos + take]))
            self._in_block += take
            pos += take
            if self._in_block == self.block_size:
                self._end_block()
        self._pending = bytes(view[pos:])

    def _end_block(self) -> None:
        self._file.update(self._block.digest())
        self._block = hashlib.md5()
        self._in_block = 0
        self._blocks += 1

    def result(self) -> dict[str, Any]:
        """The FileChecksum JSON object (consumes the checksum)."""
        if self._pending:
            self._block.update(_crcs(memoryview(self._pending)))
            self._in_block += len(self._pending)
            self._pending = b""
        if self._in_block:
            self._end_block()
        crc_per_block = self.block_size // BYTES_PER_CRC if self._blocks > 1 else 0
        raw = struct.pack(">iq", BYTES_PER_CRC, crc_per_block) + self._file.digest()
        return {
            "FileChecksum": {
                "algorithm": f"MD5-of-{crc_per_block}MD5-of-{BYTES_PER_CRC}CRC32C",
                "bytes": raw.hex(),
                "length": len(raw),
            }
        }


def _crcs(view: memoryview) -> bytes:
    return b"".join(
        crc32c.crc32c(view[i : i + BYTES_PER_CRC]).to_bytes(4, "big")
        for i in range(0, len(view), BYTES_PER_CRC)
    )


# -- errors ----------------------------------------------------------------------------


class BadPath(InvalidArgument):
    """A WebHDFS path that is not a clean absolute path (HDFS's InvalidPathException)."""


class Unsupported(InvalidArgument):
    """An operation this gateway does not do (Java's UnsupportedOperationException)."""


#: HTTP status -> (exception, javaClassName) that Hadoop's client turns back into the
#: same Java exception; statuses come from shoal's one error table (shoal.errors)
_JAVA = {
    400: ("IllegalArgumentException", "java.lang.IllegalArgumentException"),
    401: ("SecurityException", "java.lang.SecurityException"),
    403: ("AccessControlException", "org.apache.hadoop.security.AccessControlException"),
    404: ("FileNotFoundException", "java.io.FileNotFoundException"),
    503: ("RetriableException", "org.apache.hadoop.ipc.RetriableException"),
}
_IO = ("IOException", "java.io.IOException")
JAVA_CLASSES = {
    "InvalidPathException": "org.apache.hadoop.fs.InvalidPathException",
    "InvalidToken": "org.apache.hadoop.security.token.SecretManager$InvalidToken",
    "UnsupportedOperationException": "java.lang.UnsupportedOperationException",
    "FileAlreadyExistsException": "org.apache.hadoop.fs.FileAlreadyExistsException",
}


def remote_exception(status: int, message: str, exception: str | None = None) -> dict[str, Any]:
    name, java = _JAVA.get(status, _IO)
    if exception is not None:
        name, java = exception, JAVA_CLASSES[exception]
    return {"RemoteException": {"exception": name, "javaClassName": java, "message": message}}


def from_error(exc: ShoalError) -> tuple[int, dict[str, Any]]:
    """A shoal error as (HTTP status, RemoteException). 5xx carry no message (the error
    table's rule: a server failure's text may name internals)."""
    status = exc.http_status
    message = exc.message if status < 500 else f"shoal: {exc.code}"
    name = None
    if isinstance(exc, BadPath):
        name = "InvalidPathException"
    elif isinstance(exc, Unsupported):
        name = "UnsupportedOperationException"
    return status, remote_exception(status, message, name)
