from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllocatableResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AllocatableResourcesResponse(_message.Message):
    __slots__ = ("devices", "cpu_ids", "memory")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CPU_IDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[ContainerDevices]
    cpu_ids: _containers.RepeatedScalarFieldContainer[int]
    memory: _containers.RepeatedCompositeFieldContainer[ContainerMemory]
    def __init__(self, devices: _Optional[_Iterable[_Union[ContainerDevices, _Mapping]]] = ..., cpu_ids: _Optional[_Iterable[int]] = ..., memory: _Optional[_Iterable[_Union[ContainerMemory, _Mapping]]] = ...) -> None: ...

class ListPodResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPodResourcesResponse(_message.Message):
    __slots__ = ("pod_resources",)
    POD_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    pod_resources: _containers.RepeatedCompositeFieldContainer[PodResources]
    def __init__(self, pod_resources: _Optional[_Iterable[_Union[PodResources, _Mapping]]] = ...) -> None: ...

class PodResources(_message.Message):
    __slots__ = ("name", "namespace", "containers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    containers: _containers.RepeatedCompositeFieldContainer[ContainerResources]
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., containers: _Optional[_Iterable[_Union[ContainerResources, _Mapping]]] = ...) -> None: ...

class ContainerResources(_message.Message):
    __slots__ = ("name", "devices", "cpu_ids", "memory", "dynamic_resources")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CPU_IDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    name: str
    devices: _containers.RepeatedCompositeFieldContainer[ContainerDevices]
    cpu_ids: _containers.RepeatedScalarFieldContainer[int]
    memory: _containers.RepeatedCompositeFieldContainer[ContainerMemory]
    dynamic_resources: _containers.RepeatedCompositeFieldContainer[DynamicResource]
    def __init__(self, name: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[ContainerDevices, _Mapping]]] = ..., cpu_ids: _Optional[_Iterable[int]] = ..., memory: _Optional[_Iterable[_Union[ContainerMemory, _Mapping]]] = ..., dynamic_resources: _Optional[_Iterable[_Union[DynamicResource, _Mapping]]] = ...) -> None: ...

class ContainerMemory(_message.Message):
    __slots__ = ("memory_type", "size", "topology")
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    memory_type: str
    size: int
    topology: TopologyInfo
    def __init__(self, memory_type: _Optional[str] = ..., size: _Optional[int] = ..., topology: _Optional[_Union[TopologyInfo, _Mapping]] = ...) -> None: ...

class ContainerDevices(_message.Message):
    __slots__ = ("resource_name", "device_ids", "topology")
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    resource_name: str
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    topology: TopologyInfo
    def __init__(self, resource_name: _Optional[str] = ..., device_ids: _Optional[_Iterable[str]] = ..., topology: _Optional[_Union[TopologyInfo, _Mapping]] = ...) -> None: ...

class TopologyInfo(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NUMANode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NUMANode, _Mapping]]] = ...) -> None: ...

class NUMANode(_message.Message):
    __slots__ = ("ID",)
    ID_FIELD_NUMBER: _ClassVar[int]
    ID: int
    def __init__(self, ID: _Optional[int] = ...) -> None: ...

class DynamicResource(_message.Message):
    __slots__ = ("claim_name", "claim_namespace", "claim_resources")
    CLAIM_NAME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    claim_name: str
    claim_namespace: str
    claim_resources: _containers.RepeatedCompositeFieldContainer[ClaimResource]
    def __init__(self, claim_name: _Optional[str] = ..., claim_namespace: _Optional[str] = ..., claim_resources: _Optional[_Iterable[_Union[ClaimResource, _Mapping]]] = ...) -> None: ...

class ClaimResource(_message.Message):
    __slots__ = ("cdi_devices", "driver_name", "pool_name", "device_name")
    CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    cdi_devices: _containers.RepeatedCompositeFieldContainer[CDIDevice]
    driver_name: str
    pool_name: str
    device_name: str
    def __init__(self, cdi_devices: _Optional[_Iterable[_Union[CDIDevice, _Mapping]]] = ..., driver_name: _Optional[str] = ..., pool_name: _Optional[str] = ..., device_name: _Optional[str] = ...) -> None: ...

class CDIDevice(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetPodResourcesRequest(_message.Message):
    __slots__ = ("pod_name", "pod_namespace")
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    pod_name: str
    pod_namespace: str
    def __init__(self, pod_name: _Optional[str] = ..., pod_namespace: _Optional[str] = ...) -> None: ...

class GetPodResourcesResponse(_message.Message):
    __slots__ = ("pod_resources",)
    POD_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    pod_resources: PodResources
    def __init__(self, pod_resources: _Optional[_Union[PodResources, _Mapping]] = ...) -> None: ...
