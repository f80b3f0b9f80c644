"""eagle-migrate: inspect, convert (EAGLE-2/3 -> EAGLE-3.1), calibrate, quantize, validate and publish EAGLE drafters."""

__version__ = "0.1.0"
