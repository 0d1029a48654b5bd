#!/usr/bin/env bash
# Regenerate the kubelet PodResources gRPC stubs in nodeagent/podresources_pb/
# from the upstream proto shipped there (api.proto, Apache-2.0, see its header).
#
# The stubs are committed, so neither a build nor an install needs protoc; run
# this only after replacing api.proto with a newer upstream version. It needs
# grpcio-tools at dev time (pip install 'grpcio-tools==1.85.1'); the generated
# code then requires grpcio and protobuf at least as new as the versions it
# names (pyproject.toml's runtime dependencies say the same).
#
# The proto is compiled as powerflow/nodeagent/podresources_pb/api.proto so that
# the gRPC module imports its messages by their installed package name.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
out=nodeagent/podresources_pb
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/powerflow/nodeagent/podresources_pb"
cp "$out/api.proto" "$tmp/powerflow/nodeagent/podresources_pb/api.proto"
"$python" -m grpc_tools.protoc -I "$tmp" \
    --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" \
    powerflow/nodeagent/podresources_pb/api.proto
for f in api_pb2.py api_pb2.pyi api_pb2_grpc.py; do
    cp "$tmp/powerflow/nodeagent/podresources_pb/$f" "$out/$f"
done
"$python" -c 'import grpc_tools, importlib.metadata as m; print("generated with grpcio-tools", m.version("grpcio-tools"))'
