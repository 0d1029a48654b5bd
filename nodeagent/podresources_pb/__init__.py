"""Generated gRPC stubs of the kubelet's PodResources API v1 (do not edit by hand).

``api.proto`` is the upstream proto (Kubernetes, Apache-2.0: ``LICENSE`` here);
``api_pb2*.py`` were generated from it by ``scripts/gen-podresources.sh``.
``powerflow.nodeagent.podresources`` is the typed client the agent uses.
"""
