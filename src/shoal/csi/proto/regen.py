"""Regenerate csi_pb2.py, csi_pb2.pyi and csi_pb2_grpc.py from csi.proto (grpcio-tools).

The generated modules import each other as top-level ``csi_pb2``; the import is
rewritten to the package-relative form so they work as ``shoal.csi.proto.csi_pb2``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    import grpc_tools
    from grpc_tools import protoc  # only needed to regenerate: grpcio-tools (dev extra)

    include = Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{HERE}",
            f"-I{include}",
            f"--python_out={HERE}",
            f"--pyi_out={HERE}",
            f"--grpc_python_out={HERE}",
            str(HERE / "csi.proto"),
        ]
    )
    if rc:
        return int(rc)
    grpc_mod = HERE / "csi_pb2_grpc.py"
    text = grpc_mod.read_text()
    grpc_mod.write_text(
        text.replace("import csi_pb2 as csi__pb2", "from . import csi_pb2 as csi__pb2")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
