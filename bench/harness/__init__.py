"""The benchmarks' harness, by role: the machine (`machine`), the cluster and Coroner's processes on it
(`cluster`), the workers (`workers`), what is reported (`results`) and what a measurement window
counts (`window`): every name of these is also here, so a benchmark reads
`import harness as c; c.Bench(...)`. The pieces of one or two benchmarks are imported from their
modules: the same-run floor of a death's two writes (`floor`: massdeath and latency) and latency's
probe of it (`floorprobe`), latency's TTL reaper (`baseline`), steady's emulated agents
(`emulated`) and its timed operator restarts (`restarts`).

Every benchmark starts its own control plane in a temporary directory and stops every process it
started on the way out (try/finally; component and worker processes also carry a parent-death
signal, so even a SIGKILLed benchmark leaves none of them behind). Every loop is bounded in count
and in time. All traffic goes to 127.0.0.1, through `coroner.client.rest` (Coroner's own client).

Nothing here asserts on time: the benchmarks measure and report.
"""

from __future__ import annotations

from coroner.client.rest import ApiError as ApiError
from coroner.client.rest import Rest as Rest
from coroner.client.rest import registrations_path as registrations_path
from harness.cluster import ATTRIBUTION_CLASSES as ATTRIBUTION_CLASSES
from harness.cluster import RETIREMENT_READS as RETIREMENT_READS
from harness.cluster import WRITE_VERBS as WRITE_VERBS
from harness.cluster import Attribution as Attribution
from harness.cluster import Bench as Bench
from harness.cluster import Component as Component
from harness.cluster import Node as Node
from harness.cluster import RequestKey as RequestKey
from harness.cluster import Watch as Watch
from harness.cluster import apiserver_requests as apiserver_requests
from harness.cluster import cache_read_waits as cache_read_waits
from harness.cluster import client as client
from harness.cluster import create as create
from harness.cluster import create_admitted as create_admitted
from harness.cluster import diff_cache_read_waits as diff_cache_read_waits
from harness.cluster import diff_requests as diff_requests
from harness.cluster import metrics_text as metrics_text
from harness.cluster import operator_status_writes as operator_status_writes
from harness.cluster import parse_prometheus as parse_prometheus
from harness.cluster import registrant_annotation as registrant_annotation
from harness.cluster import scrape_operator as scrape_operator
from harness.machine import BIN as BIN
from harness.machine import MANIFESTS as MANIFESTS
from harness.machine import REAL_BOOT_ID_FILE as REAL_BOOT_ID_FILE
from harness.machine import REPO as REPO
from harness.machine import RESULTS as RESULTS
from harness.machine import SHARED_MACHINE_NOTE as SHARED_MACHINE_NOTE
from harness.machine import SYSTEM as SYSTEM
from harness.machine import LoadMonitor as LoadMonitor
from harness.machine import Profile as Profile
from harness.machine import Sampler as Sampler
from harness.machine import command_line as command_line
from harness.machine import free_port as free_port
from harness.machine import git_commit as git_commit
from harness.machine import log as log
from harness.machine import machine_info as machine_info
from harness.machine import py_spy as py_spy
from harness.machine import raise_nofile as raise_nofile
from harness.machine import tail as tail
from harness.machine import timed_child as timed_child
from harness.machine import top_frames as top_frames
from harness.machine import versions as versions
from harness.results import WALL_OFFSET as WALL_OFFSET
from harness.results import Tracker as Tracker
from harness.results import all_alive as all_alive
from harness.results import finish as finish
from harness.results import new_result as new_result
from harness.results import percentiles as percentiles
from harness.results import plot as plot
from harness.results import stages as stages
from harness.results import stamp_to_monotonic as stamp_to_monotonic
from harness.results import summarize as summarize
from harness.results import write_result as write_result
from harness.results import written_if_stopped as written_if_stopped
from harness.window import CpuClock as CpuClock
from harness.window import Delta as Delta
from harness.window import Snapshot as Snapshot
from harness.window import coroner_attribution as coroner_attribution
from harness.window import snapshot as snapshot
from harness.workers import WORKER_SECONDS as WORKER_SECONDS
from harness.workers import Heartbeater as Heartbeater
from harness.workers import Workers as Workers
from harness.workers import heartbeat_spec as heartbeat_spec
from harness.workers import now_text as now_text
from harness.workers import register_all as register_all
