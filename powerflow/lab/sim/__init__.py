"""The trace-driven simulator: jobs of a trace run on the ground truth's "real GPUs".

Pure Python over numpy: no Kubernetes, no clock, no NVML. Progress and energy
come from ``powerflow.lab.groundtruth``, never from a scheduler's fitted models;
every scheduler is a ``Policy`` reached through ``powerflow.core.backend``, the same
interface the operator drives, so no policy logic lives here. One deliberate
exception: ``whatif`` gives the engine the scheduler's current models as the
truth, because it predicts what a budget would cost rather than evaluating.
"""
