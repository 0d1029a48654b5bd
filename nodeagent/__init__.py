"""The node agent (``powerflow nodeagent``): the only component that touches GPUs.

It drives the GPUs of its node through ``powerflow.core.devices.GpuDevices``;
``nvml`` is the hardware implementation (NVML through ``pynvml``) and
``nvml_errors`` maps NVML's errors to ``powerflow.core.devices.GpuError``. It
imports the core, never the operator or the extender (``.importlinter``).
"""
