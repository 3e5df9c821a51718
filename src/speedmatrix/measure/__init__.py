"""Measuring: what a cell sends and what it reads back, with no knowledge of kinds, servers or jobs.

One HTTP stream (``client``) with its online loop watch (``loops``: the detector a stream can be ended by,
also run over a cell's texts afterwards); open-loop schedules (``arrivals``); prompts of an exact length
(``prompts``, ``corpus``), from datasets (``datasets``) and production traces (``traces``); the figures of
a list of requests (``stats``) and the latency targets judged over them (``slo``); Prometheus samples
(``metrics``) and NVML (``telemetry``).
"""
