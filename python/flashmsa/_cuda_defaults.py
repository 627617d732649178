"""Defaults for CUDA tensors in the direct calls: the current torch stream, and a workspace.

The C++ binding takes ``stream`` (a cudaStream_t as an integer, 0 = the legacy default stream)
and, for the index and attention ops, a uint8 device ``workspace``. When an argument is a torch
CUDA tensor and the caller left them out, these wrappers pass torch's current stream of that
device and allocate the workspace with torch (the caching allocator, so it is cheap). Callers
that must allocate nothing (CUDA-graph capture outside torch, custom allocators) pass both.
"""

import functools


def _cuda_device(values):
    for v in values:
        if getattr(v, "is_cuda", False) and hasattr(v, "device"):
            return v.device
    return None


def with_cuda_defaults(fn, params, workspace_bytes=None):
    """Wraps binding `fn` whose leading parameters are named `params`; `workspace_bytes(named)`
    gives the workspace size from the named arguments (None: the op takes no workspace)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        device = _cuda_device(list(args) + list(kwargs.values()))
        if device is not None:
            import torch

            named = dict(zip(params, args))
            named.update(kwargs)
            if kwargs.get("stream") is None:
                kwargs["stream"] = torch.cuda.current_stream(device).cuda_stream
            if workspace_bytes is not None and kwargs.get("workspace") is None:
                size = max(1, workspace_bytes(named))
                kwargs["workspace"] = torch.empty(size, dtype=torch.uint8, device=device)
        return fn(*args, **kwargs)

    return call
