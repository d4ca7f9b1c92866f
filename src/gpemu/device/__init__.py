"""The emulated device: clock, engines, streams, events, the trace recorder and EmulatedGPU."""

from gpemu.device.clock import Clock, ManualClock, RealClock
from gpemu.device.gpu import DeviceListener, DeviceStats, EmulatedGPU
from gpemu.device.graph import GraphCapture, GraphCaptureError
from gpemu.device.timeline import Engine, Event, Stream, Work
from gpemu.device.trace import TraceRecorder

__all__ = [
    "Clock",
    "DeviceListener",
    "DeviceStats",
    "EmulatedGPU",
    "Engine",
    "Event",
    "GraphCapture",
    "GraphCaptureError",
    "ManualClock",
    "RealClock",
    "Stream",
    "TraceRecorder",
    "Work",
]
